-- Printing an exact trace: print(trace), trace:step() with the new values
-- highlighted, and trace:latex(). Long atoms get names (S1 = √(...)) defined
-- where they first appear. Each function takes the trace (or step); exact/init.lua
-- binds them as its methods.
local native = require('anatomy.torch.native')
local V = require('anatomy.exact.value')
local walk = require('anatomy.exact.walk')

local show = {}

-- ---- printing ------------------------------------------------------------------------------

local LABEL_LIMIT = 32
local PREFIX = {sqrt = 'S', inv = 'D', exp = 'X', relu = 'R'}

-- Labels for long atoms, shared by all the steps of a trace so that an atom
-- is defined once, where it first appears.
local function labeller(trace, latex)
  local state = trace[latex and '_latex_labels' or '_labels']
  if not state then
    state = {names = {}, counts = {}, defined = {}}
    trace[latex and '_latex_labels' or '_labels'] = state
  end
  local ctx = {latex = latex}
  ctx.label = function(a) return state.names[a] end
  -- labels the long atoms of the values; returns the new definitions
  local function prepare(values)
    local set = {list = {}}
    for _, v in ipairs(values) do V.atoms(v, set) end
    table.sort(set.list, function(a, b) return a.id < b.id end)
    local defs = {}
    for _, a in ipairs(set.list) do
      if not state.names[a] then
        local text = V.atom_definition(a, ctx)
        if #text > LABEL_LIMIT then
          local p = PREFIX[a.kind]
          state.counts[p] = (state.counts[p] or 0) + 1
          state.names[a] = latex and (p .. '_{' .. state.counts[p] .. '}') or (p .. state.counts[p])
          defs[#defs + 1] = {name = state.names[a], text = text}
        end
      end
    end
    return defs
  end
  return ctx, prepare
end

-- pads to a width in characters (UTF-8), not bytes
local function pad(text, width)
  local n = #text:gsub('[\128-\191]', '')
  return n < width and text .. (' '):rep(width - n) or text
end

local function color(text, code, on) return on and ('\27[' .. code .. 'm' .. text .. '\27[0m') or text end

local function render_step(trace, s, opts)
  opts = opts or {}
  local ctx, prepare = labeller(trace, false)
  local defs = prepare(walk.values(s))
  local out = {}
  local title = s.name .. (s.block and (' (block ' .. s.block .. ')') or '') .. (s.head and (' [head ' .. s.head .. ']') or '')
  local reg = (s.kind == 'tokens' or s.kind == 'argmax') and '' or s:register()
  out[#out + 1] = ('%3d  %s %s %s'):format(s.index, pad(title, 22), pad(s.formula, 30), reg)
  local hl = opts.highlight
  local function show(v)
    local text = V.render(v, ctx)
    if hl then text = color(text, V.is_named(v) and '33' or '32', true) end
    return text
  end
  local T = #trace.tokens
  for pos = 1, T do
    local head = ('       %d %-4s '):format(pos, trace.tokens[pos])
    local v = s.values[pos]
    local line
    if s.kind == 'tokens' then
      line = hl and color(v, '1', true) or v
    elseif s.kind == 'argmax' then
      if v.decided then
        line = ('%d (%s)'):format(v.index, trace.model.vocab[v.index])
      else
        local names = {}
        for _, j in ipairs(v.candidates) do names[#names + 1] = trace.model.vocab[j] end
        line = 'undecidable between ' .. table.concat(names, ', ') .. ' (their bounds overlap at 4096 bits)'
      end
      if hl then line = color(line, '1', true) end
    elseif s.kind == 'scalars' then
      line = show(v)
    else
      local parts = {}
      for i, x in ipairs(v) do parts[i] = show(x) end
      local open, close = '(', ')'
      if s.kind == 'rows' then open, close = '[', ']' end
      line = open .. table.concat(parts, ', ') .. close
      if #line > 110 and #parts > 1 then
        out[#out + 1] = head .. open
        for i, p in ipairs(parts) do out[#out + 1] = ('              %d: %s'):format(i, p) end
        line = nil
        out[#out + 1] = '              ' .. close
      end
    end
    if line then out[#out + 1] = head .. line end
    if s.notes and s.notes[pos] then out[#out + 1] = '              (' .. s.notes[pos] .. ')' end
  end
  for _, d in ipairs(defs) do out[#out + 1] = ('       where %s = %s'):format(d.name, d.text) end
  return table.concat(out, '\n')
end

-- show.trace(trace): the whole trace, every step in order (Trace.__tostring).
function show.trace(trace)
  local m = trace.model
  local lines = {('exact trace of "%s": %d position%s, d = %d, %d block%s'):format(
    table.concat(trace.tokens, ' '), #trace.tokens, #trace.tokens == 1 and '' or 's', m.d, #m.blocks, #m.blocks == 1 and '' or 's')}
  for _, s in ipairs(trace.steps) do lines[#lines + 1] = render_step(trace, s) end
  lines[#lines + 1] = ('output: %s'):format(table.concat(trace.output, ' '))
  return table.concat(lines, '\n')
end

-- show.step_name(step): its name (Step.__tostring).
function show.step_name(s) return s.name end

-- trace:step([k]): prints the next step (or step k) with its new values
-- highlighted and returns it; trace:reset() starts over.
function show.step(trace, k)
  if k ~= nil then
    if type(k) ~= 'number' or k < 1 or k > #trace.steps or k ~= math.floor(k) then
      error(('trace:step: step must be in 1..%d, got %s'):format(#trace.steps, tostring(k)), 2)
    end
    trace.cursor = k
  else
    if trace.cursor >= #trace.steps then
      print(('(end of the trace: %d steps; trace:reset() to start over)'):format(#trace.steps))
      return nil
    end
    trace.cursor = trace.cursor + 1
  end
  local s = trace.steps[trace.cursor]
  local tty = native.isatty(1)
  if trace.cursor > 1 then
    local prev = trace.steps[trace.cursor - 1]
    print(color(('     after %d %s'):format(prev.index, prev.name), '2', tty))
  end
  print(render_step(trace, s, {highlight = tty}))
  print(color(('     step %d of %d; trace:step() for the next'):format(trace.cursor, #trace.steps), '2', tty))
  return s
end

function show.reset(trace) trace.cursor = 0 end

-- trace:latex() -> the whole trace as a LaTeX fragment (align* environments).
function show.latex(trace)
  local ctx, prepare = labeller(trace, true)
  local out = {'% exact trace of "' .. table.concat(trace.tokens, ' ') .. '"'}
  local function tex_name(s) return (s.name:gsub('_', '\\_'):gsub('%+', '{+}')) end
  for _, s in ipairs(trace.steps) do
    local defs = prepare(walk.values(s))
    out[#out + 1] = ('\\paragraph{%d. %s%s} (%s)'):format(s.index, tex_name(s),
      s.block and (' (block ' .. s.block .. ')') or '', (s.kind == 'tokens' or s.kind == 'argmax') and 'tokens' or s:register())
    out[#out + 1] = '\\begin{align*}'
    local rows = {}
    for pos = 1, #trace.tokens do
      local v = s.values[pos]
      local body
      if s.kind == 'tokens' then
        body = '\\texttt{' .. v .. '}'
      elseif s.kind == 'argmax' then
        body = v.decided and ('%d\\ (\\texttt{%s})'):format(v.index, trace.model.vocab[v.index]) or '\\text{undecidable}'
      elseif s.kind == 'scalars' then
        body = V.render(v, ctx)
      else
        local parts = {}
        for i, x in ipairs(v) do parts[i] = V.render(x, ctx) end
        body = '\\left(' .. table.concat(parts, ',\\ ') .. '\\right)'
      end
      rows[#rows + 1] = ('\\text{%d (\\texttt{%s})} &: %s'):format(pos, trace.tokens[pos], body)
    end
    for _, d in ipairs(defs) do rows[#rows + 1] = ('\\text{where } %s &= %s'):format(d.name, d.text) end
    out[#out + 1] = table.concat(rows, ' \\\\\n')
    out[#out + 1] = '\\end{align*}'
  end
  return table.concat(out, '\n')
end

return show
