-- autopsy: one call that says what each layer of a model is doing: where the
-- gradient goes, how rank collapses, whether attention is sharp or flat,
-- how activations grow, which blocks are passengers, what the logit lens
-- reads at each depth and what removing a layer costs. The result prints as
-- a table, saves as JSON and renders as an HTML report (report.lua).
local measure = require('anatomy.autopsy.measure')
local verdicts = require('anatomy.autopsy.verdicts')
local format = require('anatomy.render.format')

local autopsy = {}

-- Verdict thresholds (verdicts.lua explains each; override with opts.thresholds).
autopsy.thresholds = verdicts.thresholds

-- The measures autopsy.run takes by default (opts.metrics picks some).
autopsy.all_metrics = measure.all_metrics

-- The registry of the per-layer measures: each one's name, meaning, phase
-- and the outputs that show it (measures.lua; measures.where('csv') lists
-- the CSV's columns, and so on).
autopsy.measures = require('anatomy.autopsy.measures')

autopsy.Autopsy = require 'anatomy.autopsy.Autopsy'

-- autopsy.run(model, batch_or_corpus, opts) -> Autopsy (run.lua documents opts)
autopsy.run = require 'anatomy.autopsy.run'

-- autopsy.step(model, fn) -> snapshot, fn's result (measure.lua)
autopsy.step = measure.step

-- autopsy.compare{a, b, ...} -> several autopsies side by side (compare.lua):
-- printable, c:report(path) (one HTML report), c:json(path)
autopsy.compare = require('anatomy.autopsy.compare').compare

-- autopsy.series(source, {revisions, model, ...}, data, opts) -> the autopsy
-- at each checkpoint of a run, and when each layer's verdict changed (series.lua)
autopsy.series = require('anatomy.autopsy.series').series

-- autopsy.format(v, digits): numbers as the autopsy's tables print them
autopsy.format = format.number

return autopsy
