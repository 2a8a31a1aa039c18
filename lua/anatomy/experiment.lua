-- experiment: what the examples share: a config with --smoke, the data
-- they run on, and the table that sets a published claim beside our
-- measurement with a verdict (reproduced / differs / refuted).
local experiment = {}

-- experiment.config(defaults, args, usage): torch.config.parse plus smoke = false;
-- with --smoke=true, `smoke` overrides (a few steps) are applied.
function experiment.config(defaults, smoke, args, usage)
  defaults.smoke = false
  local cfg = torch.config.parse(defaults, args, usage)
  if cfg.smoke then for k, v in pairs(smoke or {}) do cfg[k] = v end end
  return cfg
end

-- The text an example trains on: --data, else Tiny Shakespeare where the
-- project's shared data is, else the King James Bible; and a note saying which.
function experiment.corpus(path, opts)
  -- beside the checkout (shared/ next to it), from the current folder or from the script's
  local root = arg and arg[0] and arg[0]:match('^(.*)/examples/[^/]*$')
  local candidates = {'../shared/data/tinyshakespeare.txt', 'shared/data/tinyshakespeare.txt'}
  if root then table.insert(candidates, 1, root .. '/../shared/data/tinyshakespeare.txt') end
  if path ~= '' then candidates = {path} end
  for _, p in ipairs(candidates) do
    local f = io.open(p, 'rb')
    if f then
      f:close()
      return data.text(p, opts), p
    end
  end
  if path ~= '' then error(("cannot open '%s'"):format(path), 2) end
  local kjv = data.default_text()
  return data.text(kjv, opts), kjv .. ' (Tiny Shakespeare not found: numbers are not comparable with the claim)'
end

-- experiment.verdict(ours, low, high): 'reproduced' inside [low, high], 'differs' otherwise
function experiment.verdict(ours, low, high)
  if ours == nil or ours ~= ours then return 'not measured' end
  if ours >= low and ours <= high then return 'reproduced' end
  return 'differs'
end

local Results = {}
Results.__index = Results

-- experiment.results(title) -> a table of {claim, published, ours, verdict} rows
function experiment.results(title)
  return setmetatable({title = title, rows = {}}, Results)
end

-- results:add(claim, published, ours, verdict)
function Results:add(claim, published, ours, verdict)
  self.rows[#self.rows + 1] = {claim, tostring(published), type(ours) == 'number' and autopsy.format(ours) or tostring(ours), verdict}
end

function Results:__tostring()
  local header = {'claim', 'published', 'ours', 'verdict'}
  local widths = {}
  for c = 1, 4 do
    widths[c] = #header[c]
    for _, r in ipairs(self.rows) do widths[c] = math.max(widths[c], #r[c]) end
  end
  local function line(r)
    local parts = {}
    for c = 1, 4 do parts[c] = r[c] .. (' '):rep(widths[c] - #r[c]) end
    return '| ' .. table.concat(parts, ' | ') .. ' |'
  end
  local seps = {}
  for c = 1, 4 do seps[c] = ('-'):rep(widths[c]) end
  local out = {'### ' .. self.title, '', line(header), '|-' .. table.concat(seps, '-|-') .. '-|'}
  for _, r in ipairs(self.rows) do out[#out + 1] = line(r) end
  return table.concat(out, '\n')
end

-- results:save(path): the table as Markdown
function Results:save(path)
  local f = assert(io.open(path, 'wb'))
  f:write(tostring(self), '\n')
  f:close()
  return path
end

return experiment
