-- The saes option's columns: each SAE (or CLT) evaluated with sae.evaluate
-- on as many val batches as the autopsy read, and its numbers put on the
-- rows of the layers it reads. An SAE fills its layer's row; a sae.CLT
-- fills every layer's: that layer's features alive and L0, the explained
-- variance of that layer's MLP output, and (the CLT replacing every MLP at
-- once) no per-layer CE loss recovered, which a note gives for the whole.
local saes = {}

-- saes.rows(s, a, list): list as arguments.check_saes returns it ({sae, row}
-- or {clt, layer, row} each)
function saes.rows(s, a, list)
  local evaluate = require('anatomy.features.splice').evaluate
  local done = {}
  local by_row = {}
  for _, r in ipairs(a.rows) do by_row[r.name] = r end
  for _, e in ipairs(list) do
    local d = e.sae or e.clt
    local ev = done[d] or evaluate(s.model, d, s.source, {batches = s.steps, batch = s.opts.batch or 8, seq = s.seq})
    done[d] = ev
    local r = by_row[e.row]
    if r and e.sae then
      r.sae_alive = e.sae.cfg.d_sae - math.floor(ev.dead * e.sae.cfg.d_sae + 0.5)
      r.sae_d_sae = e.sae.cfg.d_sae
      r.sae_l0, r.sae_ev, r.sae_ce_recovered = ev.l0, ev.explained_variance, ev.ce_recovered
      if not ev.ce_recovered then s.missing.sae_ce_recovered = ev.notes[1] end
    elseif r then
      local layer = ev.layers[e.layer]
      r.sae_alive, r.sae_d_sae = layer.alive, e.clt.cfg.d_transcoder
      r.sae_l0, r.sae_ev = layer.l0, layer.explained_variance
      s.missing.sae_ce_recovered = ev.ce_recovered and ('a CLT replaces every MLP at once: its CE loss recovered is the whole '
        .. "CLT's, %.4f, not a layer's"):format(ev.ce_recovered) or ev.notes[#ev.notes]
    end
  end
end

return saes
