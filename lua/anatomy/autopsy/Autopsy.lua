-- Autopsy: the result of autopsy.run, a value: printable as the per-layer
-- table (format.lua), savable as JSON, renderable as an HTML report
-- (report.lua). Its methods are all here; the work is in those files.
local json = require 'anatomy.json'
local fs = require 'anatomy.fs'
local format = require 'anatomy.autopsy.format'

local Autopsy = {}
Autopsy.__index = Autopsy

-- The per-layer table, the verdicts' rule, and each parameter's |grad| and rank.
function Autopsy:__tostring() return format.table(self) end

-- Each parameter's gradient norm and, for matrices, its effective rank.
function Autopsy:parameter_table() return format.parameter_table(self) end

-- a:plot(metric): a compact chart of one column per layer, in the terminal
-- ('grad_norm', 'erank', 'entropy', 'diag', 'act_std', 'amplification', 'residual',
-- 'influence', 'lens_loss', 'removal_loss').
function Autopsy:plot(metric)
  local text = format.plot(self, metric)  -- not a tail call: errors name the caller's line
  return text
end

-- The autopsy as plain data (what json() writes).
function Autopsy:data()
  local rows = {}
  for i, r in ipairs(self.rows) do
    local copy = {}
    for k, v in pairs(r) do if k ~= 'grads' then copy[k] = v end end
    rows[i] = copy
  end
  return {provenance = self.provenance, model = self.model, loss = self.loss, rows = rows, params = self.params, weights = self.weights,
    removal = self.removal, thresholds = self.thresholds, missing = self.missing,
    entropy_heads = self.entropy_heads, patterns = self.patterns,
    history = self.history and {train = self.history.train, val = self.history.val, probes = self.history.probes,
      first_step = self.history.first_step} or nil}
end

-- a:json(path): writes the autopsy as JSON; returns path
function Autopsy:json(path)
  return fs.write_atomic(path, json.encode(self:data()) .. '\n')
end

-- a:report(path): writes the HTML report atomically; returns path
function Autopsy:report(path)
  return fs.write_atomic(path, require('anatomy.autopsy.report').html(self))
end

return Autopsy
