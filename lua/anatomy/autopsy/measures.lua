-- The autopsy's measures, each once: its name (the one the terminal, the
-- HTML report, the JSON, the CSV and a:plot use), what it measures, the
-- phase of autopsy.run that computes it, how the table prints it, and which
-- outputs show it. Every list of measures in the autopsy is a filter of this
-- one (measures.where), in this order.
--
-- A row measure's fields:
--   meaning  one line: what it measures (the legend under the table)
--   phase    batches: each measured batch's forward and backward, averaged
--            over the batches (run.lua's per-layer sums); rows: from the
--            averaged parameters' gradients and the weights; removal: blocks
--            skipped; saes: autopsy.run{saes}; moe: autopsy/moe.lua (a
--            layer holding an nn.MoE: its routers read, experts removed);
--            verdicts: verdicts.lua
--   metric   the opts.metrics name that asks for it (autopsy.all_metrics);
--            grad_norm, act_std and what comes with them are measured always
--   digits   decimals in the terminal table (3 without); text: its own cell
--   unit     nats for losses, entropies and KLs (a chart's axis says so)
--   table    always: a column of the terminal and HTML tables with its
--            legend line; present: one when some row has a value
--   terminal false: not a column of the terminal table (a line under it)
--   csv      a column of a:csv and a scalar of a:tensorboard ('present':
--            one when some row has a value)
--   plot     a:plot and a:chart draw it
--   compare  autopsy.compare tabulates it; series: autopsy.series does
--   chart    the report's chart ({title, over = 'rows' or the blocks}) and
--            the comparison's depth profile (compare = title)
--   verdict  verdicts.lua reads it
local measures = {}

measures.rows = {
  {name = 'grad_norm', phase = 'rows', metric = 'grad_norm', digits = 4, table = 'always', csv = true, plot = true,
    compare = true, series = true, verdict = true, chart = {title = 'grad_norm per row', over = 'rows', compare = 'grad_norm by depth'},
    meaning = 'norm of the loss gradient of the row\'s parameters; its share of the largest row\'s is the verdict\'s gradient share'},
  {name = 'erank', phase = 'batches', metric = 'erank', table = 'always', csv = true, plot = true, compare = true, series = true,
    chart = {title = 'erank per layer (the rank funnel)', compare = 'erank by depth (the rank funnel)'},
    text = function(r, fmt)
      return r.erank and ('%s (%d%%)'):format(fmt(r.erank, 1), math.floor(100 * r.erank_ratio + 0.5)) or '-'
    end,
    meaning = 'effective rank of the row\'s output (exp of the entropy of its singular values), with its share of the width'},
  {name = 'erank_ratio', phase = 'rows', metric = 'erank', csv = true,
    meaning = 'erank over the width of the row\'s output (the terminal prints it beside erank)'},
  {name = 'entropy', phase = 'batches', metric = 'attn_entropy', unit = 'nats', table = 'always', csv = true, plot = true,
    compare = true, series = true, chart = {title = 'entropy per layer', compare = 'entropy by depth (nats)'},
    meaning = 'mean entropy of the attention rows, in nats (low: sharp attention)'},
  {name = 'diag', phase = 'batches', metric = 'attn_entropy', table = 'always', csv = true, plot = true, compare = true,
    meaning = 'mean attention a position pays to itself'},
  {name = 'act_std', phase = 'batches', metric = 'act_std', table = 'always', csv = true, plot = true, compare = true, series = true,
    chart = {title = 'act_std per layer', compare = 'act_std by depth'},
    meaning = 'standard deviation of the row\'s output'},
  {name = 'act_mean', phase = 'batches', metric = 'act_std', plot = true, meaning = 'mean of the row\'s output'},
  {name = 'act_max', phase = 'batches', metric = 'act_std', plot = true, meaning = 'largest |value| of the row\'s output'},
  {name = 'act_rms', phase = 'batches', metric = 'act_std', plot = true, meaning = 'root mean square of the row\'s output'},
  {name = 'amplification', phase = 'batches', metric = 'act_std', digits = 2, table = 'always', csv = true, plot = true,
    compare = true, series = true, verdict = true,
    meaning = 'std of the block\'s output over std of its input; the verdict says exploding above the threshold'},
  {name = 'residual', phase = 'batches', metric = 'residual', table = 'always', csv = true, plot = true, compare = true, series = true,
    verdict = true,
    meaning = 'mean |output - input| / |input| per token: the block\'s own contribution beside its input; a passenger below the threshold'},
  {name = 'influence', phase = 'batches', metric = 'influence', digits = 4, table = 'always', csv = true, plot = true,
    compare = true, series = true,
    meaning = '1 - the mean cosine between the block\'s input and output, per token (how far it turns the stream); the least influential are the ones removed together'},
  {name = 'lens_loss', phase = 'batches', metric = 'logit_lens', unit = 'nats', table = 'always', csv = true, plot = true,
    compare = true, series = true,
    chart = {title = 'lens_loss: loss read out after each layer (logit lens)', reference = true, compare = 'lens_loss by depth'},
    meaning = 'loss of the readout (logit lens) applied to the row\'s output'},
  {name = 'lens_agree', phase = 'batches', metric = 'logit_lens', plot = true,
    meaning = 'share of positions whose top token read through the logit lens is the model\'s own'},
  -- with a tuned lens (autopsy.run{lens = l}): shown when a row has them, beside lens_loss
  {name = 'lens_kl', phase = 'batches', metric = 'logit_lens', unit = 'nats', table = 'present', csv = true, plot = true,
    meaning = 'KL(final || logit lens) in nats: how far the row\'s output read as it is lies from the model\'s prediction'},
  {name = 'tuned_lens_loss', phase = 'batches', metric = 'logit_lens', unit = 'nats', table = 'present', csv = true, plot = true,
    meaning = 'loss of the tuned lens (the row\'s output through its trained affine translator, then the readout)'},
  {name = 'tuned_kl', phase = 'batches', metric = 'logit_lens', unit = 'nats', table = 'present', csv = true, plot = true,
    meaning = 'KL(final || tuned lens) in nats'},
  {name = 'removal_loss', phase = 'removal', metric = 'removal', unit = 'nats', table = 'always', csv = true, plot = true,
    compare = true, series = true, verdict = true, chart = {title = 'removal_loss: how much the loss rises with each layer removed', rise = true},
    meaning = 'loss of the model with the block removed (its output replaced by its input); a passenger when it adds less than the threshold of the loss'},
  -- a residual wrapper whose skip path is not the identity (nn.Gate, nn.HyperConnections): shown when a row has them
  {name = 'f_residual', phase = 'batches', metric = 'residual', table = 'present', csv = true, plot = true, compare = true,
    series = true, verdict = true,
    meaning = 'residual wrapper: mean |f(x)| / |skip(x)| per token, f\'s output beside the wrapper\'s own path (gate(x)); replaces residual in the verdict'},
  {name = 'f_influence', phase = 'batches', metric = 'influence', csv = true, plot = true,
    meaning = 'residual wrapper: influence of f\'s output beside the wrapper\'s own path (gate(x))'},
  {name = 'f_removal_loss', phase = 'removal', metric = 'removal', unit = 'nats', table = 'present', csv = true, plot = true,
    compare = true, series = true, verdict = true,
    meaning = 'residual wrapper: loss with f zeroed and the wrapper\'s own path kept (gate(x) alone); replaces removal_loss in the verdict'},
  {name = 'gate_identity_loss', phase = 'removal', metric = 'removal', unit = 'nats', table = 'present', csv = true, plot = true,
    compare = true, series = true, meaning = 'nn.Gate: loss with the gate replaced by the identity (x + f(x)), f kept'},
  -- nn.Gate's own: the terminal prints them on a line under the table
  {name = 'gate_grad', phase = 'rows', metric = 'grad_norm', table = 'present', terminal = false, csv = true, plot = true,
    compare = true, meaning = 'nn.Gate: norm of the gradient of the gate\'s weight'},
  {name = 'gate_identity', phase = 'rows', metric = 'grad_norm', table = 'present', terminal = false, csv = true, plot = true,
    compare = true, meaning = 'nn.Gate: |W - I| / sqrt(d), how far the gate has moved from the identity'},
  -- with SAEs (autopsy.run{saes = {...}}): shown on the rows of the layers they read
  {name = 'sae_alive', phase = 'saes', table = 'present', csv = true,
    text = function(r) return r.sae_alive and ('%d/%d'):format(r.sae_alive, r.sae_d_sae) or '-' end,
    meaning = 'SAE in the layer (or a CLT\'s layer): features that fired on the evaluation tokens (of its d_sae)'},
  {name = 'sae_l0', phase = 'saes', table = 'present', csv = true, meaning = 'SAE in the layer: features active per token'},
  {name = 'sae_ev', phase = 'saes', table = 'present', csv = true,
    meaning = 'SAE in the layer: explained variance of its reconstruction, 1 - sum |x - x_hat|^2 / sum |x - mean|^2 (a CLT: of the layer\'s MLP output)'},
  {name = 'sae_ce_recovered', phase = 'saes', table = 'present', csv = true,
    meaning = 'SAE in the layer: (loss zero-ablated - loss spliced) / (loss zero-ablated - clean loss), the reconstruction in place of the point'},
  -- a layer holding a mixture of experts (an nn.MoE, found by autopsy/moe.lua whatever the family): shown on its rows.
  -- Experts are numbered from 1, as anatomy's parameters (mlp.experts.1); Hugging Face's from 0.
  {name = 'router_entropy', phase = 'moe', unit = 'nats', table = 'present', csv = 'present',
    text = function(r, fmt)
      if not r.router_entropy then return '-' end
      return r.router_entropy_ratio and ('%s (%d%%)'):format(fmt(r.router_entropy), math.floor(100 * r.router_entropy_ratio + 0.5))
        or fmt(r.router_entropy)
    end,
    meaning = 'MoE: mean over tokens of the entropy of the router\'s softmax over its E experts, in nats, not normalised; '
      .. 'in parentheses its share of log E (100%: uniform routing)'},
  {name = 'router_entropy_ratio', phase = 'moe', csv = 'present',
    meaning = 'MoE: router_entropy / log E (the terminal prints it beside router_entropy)'},
  {name = 'expert_load_max', phase = 'moe', table = 'present', csv = 'present',
    meaning = 'MoE: the largest expert load, an expert\'s load being its share of the routed slots (every token\'s top_k slots '
      .. 'counted, so the E loads sum to 1; uniform: 1/E)'},
  {name = 'experts_dead', phase = 'verdicts', table = 'present', csv = 'present',
    text = function(r) return r.experts_dead and ('%d/%d'):format(r.experts_dead, #r.expert_load) or '-' end,
    meaning = 'MoE: dead experts, of E: load at most the dead_expert threshold (default 0: no token routed to it on the autopsy\'s batches)'},
  {name = 'top1_loss', phase = 'moe', metric = 'removal', unit = 'nats', table = 'present', csv = 'present',
    meaning = 'MoE: loss with this layer\'s router keeping its top-1 expert alone in place of its top_k (weight 1 when '
      .. 'norm_topk_prob, else its probability)'},
  {name = 'experts_passenger', phase = 'verdicts', table = 'present', csv = 'present',
    text = function(r)
      local v = r.experts_passenger
      if not v then return '-' end
      local n, cut = 0, nil
      for i in v:gmatch('()[^,]+') do n = n + 1; if n == 7 then cut = i end end
      return cut and ('%s +%d more'):format(v:sub(1, cut - 2), n - 6) or v
    end,
    meaning = 'MoE: the experts whose removal raises the loss by under the passenger_expert threshold of it (dead ones marked): '
      .. 'the rule is under the table'},
  -- each expert's, E numbers a row (the JSON's rows, and a.moe.experts)
  {name = 'expert_load', phase = 'moe',
    meaning = 'MoE: each expert\'s load, its share of the routed slots (each token counted once in each of its top_k slots)'},
  {name = 'expert_tokens', phase = 'moe',
    meaning = 'MoE: each expert\'s count of routed slots (tokens routed to it) over the autopsy\'s batches, real positions only'},
  {name = 'expert_removal_loss', phase = 'moe', metric = 'removal', unit = 'nats',
    meaning = 'MoE: the loss with each expert removed: its router logit -inf, so its probability is 0 and the softmax is over the '
      .. 'others (each p / (1 - p_removed)), from which the router picks its top_k (all the others when fewer remain), renormalised '
      .. 'when norm_topk_prob'},
  {name = 'verdict', phase = 'verdicts', table = 'always', csv = true, compare = true,
    text = function(r) return r.verdict or '' end,
    meaning = 'worker, passenger, exploding, or boundary (input/output rows): the rule is under the table'},
}

-- What a row is, before its measures: the first columns of the CSV.
measures.identity = {'name', 'kind'}

-- The parameter table's measures (a.params, a.weights): each parameter's
-- gradient norm, and every 2-D weight's effective rank (opts.metrics
-- 'weight_erank', measured in one batched call).
measures.parameters = {
  {name = 'grad_norm', phase = 'rows', metric = 'grad_norm', meaning = 'norm of the parameter\'s loss gradient'},
  {name = 'erank', phase = 'rows', metric = 'weight_erank', meaning = 'effective rank of a 2-D weight, with its share of the full rank'},
}

measures.by_name = {}
for _, m in ipairs(measures.rows) do
  measures.by_name[m.name] = m
  m.cell = m.text or function(r, fmt) return fmt(r[m.name], m.digits) end
end

-- measures.where(field[, value]) -> the names of the row measures whose
-- field is set (or equals value), in the registry's order
function measures.where(field, value)
  local out = {}
  for _, m in ipairs(measures.rows) do
    if (value == nil and m[field]) or (value ~= nil and m[field] == value) then out[#out + 1] = m.name end
  end
  return out
end

-- Every name opts.metrics takes, in the registry's order (autopsy.all_metrics).
function measures.metrics()
  local out, seen = {}, {}
  for _, list in ipairs{measures.rows, measures.parameters} do
    for _, m in ipairs(list) do
      if m.metric and not seen[m.metric] then seen[m.metric] = true; out[#out + 1] = m.metric end
    end
  end
  return out
end

-- measures.label(name) -> the axis label of a measure: its name, and its unit
function measures.label(name)
  local m = measures.by_name[name]
  return m.unit and ('%s (%s)'):format(name, m.unit) or name
end

return measures
