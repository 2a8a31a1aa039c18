-- The lens's per-token views of one text: l:trajectory(text) (entropy, KL
-- to the final distribution and the rank of the final top token, per row and
-- position) and l:table(text, {k}) (the top-k tokens per row and position),
-- each printable and drawn by :svg(). Each view takes the lens; lens.lua binds
-- them as its methods. What they read is lens_states.lua's, as l:evaluate's.
local torch = require('anatomy.torch')
local inputs = require('anatomy.probe.inputs')
local lens_states = require('anatomy.probe.lens_states')
local options = require('anatomy.torch.options')
local terminal = require('anatomy.render.terminal')

local views = {}

-- Per row and position of one text: the lens's log-probabilities and the final ones.
local function one_text(lens, input, opts, where)
  local ids, tok, mask = lens_states.batch_of(lens, input, opts, where, 3)
  if ids:size(1) ~= 1 then error(('%s: one text (or one row of ids), got %d'):format(where, ids:size(1)), 3) end
  local h, logits = lens_states.states(lens, ids, mask, where)
  local reads = {}
  torch.no_grad(function()
    for i = 0, #lens.names - 1 do reads[i + 1] = lens:readout(i, h[i])[1]:log_softmax(-1):float() end
  end)
  return ids, tok, reads, logits[1]:log_softmax(-1):float()
end

-- The charts' column labels: each position's number and input token.
local function position_labels(tokens)
  local cols = {}
  for t, s in ipairs(tokens) do cols[t] = ('%d %s'):format(t, terminal.token_label(s, 10)) end
  return cols
end

-- A view's class, and a view of one text: the lens's rows and kind, the text's tokens and the view's own fields.
local function view_class(typename)
  local cls = {__typename = typename}
  cls.__index = cls
  return cls
end
local function view(cls, lens, ids, tok, fields)
  fields.layers, fields.kind, fields.tokens = lens.names, lens.kind, inputs.token_texts(ids, tok)[1]
  return setmetatable(fields, cls)
end

local Trajectory = view_class('lens.Trajectory')

-- l:trajectory(text, {tokenizer}) -> t: per row (t.layers: 'embed', then
-- each layer) and position (t.tokens), t.entropy (nats of the lens's
-- distribution), t.kl (KL(final || lens), nats), t.rank (the rank of the
-- model's final top token in the lens's ranking, 1 = top), as lists
-- [row][position]. print(t) shows them; t:svg(what) draws one.
function views.trajectory(lens, input, opts)
  local where = 'lens:trajectory'
  opts = options.check(opts, {'tokenizer'}, where, 2)
  local ids, tok, reads, final = one_text(lens, input, opts, where)
  local top = final:argmax(-1)  -- (T)
  local out = view(Trajectory, lens, ids, tok, {entropy = {}, kl = {}, rank = {}})
  for r, lp in ipairs(reads) do
    out.entropy[r] = (-(lp:exp() * lp):sum(-1)):tolist()
    out.kl[r] = (final:exp() * (final - lp)):sum(-1):tolist()
    local at_top = lp:gather(2, top:unsqueeze(2))  -- (T, 1)
    out.rank[r] = (lp:gt(at_top):sum(2) + 1):tolist()
  end
  return out
end

local function grid(title, rows, tokens, m, fmt)
  local cols = {}
  for t, s in ipairs(tokens) do cols[t] = terminal.token_label(s, 8) end
  local lines = {title, ('%-14s'):format('') .. table.concat((function()
    local c = {}
    for t = 1, #cols do c[t] = ('%8s'):format(cols[t]) end
    return c
  end)(), ' ')}
  for r, name in ipairs(rows) do
    local cells = {}
    for t = 1, #tokens do cells[t] = (fmt):format(m[r][t]) end
    lines[#lines + 1] = ('%-14s'):format(terminal.token_label(name, 14)) .. table.concat(cells, ' ')
  end
  return table.concat(lines, '\n')
end

function Trajectory:__tostring()
  return table.concat({
    grid(('%s lens: KL(final || lens) in nats, per layer (rows) and position (columns)'):format(self.kind), self.layers, self.tokens, self.kl, '%8.3f'),
    grid('entropy of the lens (nats)', self.layers, self.tokens, self.entropy, '%8.3f'),
    grid('rank of the final top token (1 = the lens agrees)', self.layers, self.tokens, self.rank, '%8d')}, '\n\n')
end

-- t:svg(what = 'kl'|'entropy'|'rank') -> a heatmap: rows by positions.
function Trajectory:svg(what)
  what = what or 'kl'
  if what ~= 'kl' and what ~= 'entropy' and what ~= 'rank' then
    error(("trajectory:svg: what must be 'kl', 'entropy' or 'rank', got %s"):format(tostring(what)), 2)
  end
  local cols = position_labels(self.tokens)
  local label = ({kl = 'KL(final || lens), nats', entropy = 'entropy, nats', rank = 'rank of the final top token'})[what]
  return require('anatomy.render.charts').heatmap(('%s lens: %s'):format(self.kind, label), self.layers, cols, self[what],
    what == 'rank', {xlabel = 'position (input token)', ylabel = 'read after', value = label})
end

local Table = view_class('lens.Table')

-- l:table(text, {k = 5, tokenizer}) -> t: the k tokens each row's lens
-- ranks first at each position (t.top[row][position] = {{token, p}, ...}),
-- and the KL to the final distribution (t.kl). print(t) lists them position
-- by position; t:svg() draws rows by positions coloured by KL with each
-- cell's top token written in it.
function views.table(lens, input, opts)
  local where = 'lens:table'
  opts = options.check(opts, {'k', 'tokenizer'}, where, 2)
  local k = options.whole(opts.k, 'k', where, 5, 1, 3)
  local ids, tok, reads, final = one_text(lens, input, opts, where)
  local V = final:size(-1)
  if k > V then error(('%s: k must be at most the vocabulary (%d), got %d'):format(where, V, k), 2) end
  local out = view(Table, lens, ids, tok, {k = k, top = {}, kl = {}})
  local function text_of(id)
    local ok, s = false, nil
    if tok and tok.decode then ok, s = pcall(tok.decode, tok, torch.tensor({id}, {dtype = 'int64'})) end
    return ok and s or ('#' .. id)
  end
  for r, lp in ipairs(reads) do
    out.kl[r] = (final:exp() * (final - lp)):sum(-1):tolist()
    local values, indices = lp:topk(k, -1)
    local pv, iv = values:exp():tolist(), indices:tolist()
    out.top[r] = {}
    for t = 1, #pv do
      local cell = {}
      for j = 1, k do cell[j] = {text_of(iv[t][j]), pv[t][j]} end
      out.top[r][t] = cell
    end
  end
  return out
end

function Table:__tostring()
  local lines = {('%s lens: the top %d tokens after each layer, position by position (p; KL to the final distribution in nats)'):format(self.kind, self.k)}
  for t, s in ipairs(self.tokens) do
    lines[#lines + 1] = ('position %d, input %s'):format(t, terminal.token_label(s, 24))
    for r, name in ipairs(self.layers) do
      local cells = {}
      for j, c in ipairs(self.top[r][t]) do cells[j] = ('%s %.2f'):format(terminal.token_label(c[1], 10), c[2]) end
      lines[#lines + 1] = ('  %-14s KL %6.3f  %s'):format(terminal.token_label(name, 14), self.kl[r][t], table.concat(cells, '  '))
    end
  end
  return table.concat(lines, '\n')
end

-- t:svg({range = {low, high}}) -> rows (read after) by positions (input
-- token), coloured by KL to the final distribution, each cell's top token
-- written in it; range: the colour scale's ends (one scale for two lenses'
-- tables), else the values' own.
function Table:svg(opts)
  opts = options.check(opts, {'range'}, 'table:svg', 2)
  if opts.range ~= nil and (type(opts.range) ~= 'table' or type(opts.range[1]) ~= 'number' or type(opts.range[2]) ~= 'number'
      or not (opts.range[2] > opts.range[1])) then
    error('table:svg: range must be {low, high} with low < high', 2)
  end
  local cols, labels = position_labels(self.tokens), {}
  for r = 1, #self.layers do
    labels[r] = {}
    for t = 1, #self.tokens do labels[r][t] = self.top[r][t][1][1] end
  end
  return require('anatomy.render.charts').heatmap(('%s lens: top token after each layer, coloured by KL to the final distribution'):format(self.kind),
    self.layers, cols, self.kl, false, {xlabel = 'position (input token)', ylabel = 'read after', value = 'KL (nats)', labels = labels,
      range = opts.range})
end

return views
