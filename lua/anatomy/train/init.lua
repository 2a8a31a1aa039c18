-- train: the training loop (AdamW, schedules, clipping, evaluation,
-- checkpoints that resume exactly), evaluation of a model on a text, and
-- checks that stop at the first NaN with its place named. Its parts:
--   config.lua      the options, each with its default and what it does
--   Trainer.lua     one run: resume, prepare, step, report, checkpoint
--   parallel.lua    data parallelism over a world of ranks
--   evaluate.lua    the loss on a validation split or a text
--   checkpoint.lua  save and load
--   Run.lua         what train.fit returns
--   log.lua         the JSON-lines log, read back and exported
local torch = require('anatomy.torch')
local dist = require('anatomy.torch.dist')
local config = require('anatomy.train.config')
local Trainer = require('anatomy.train.Trainer')
local checkpoint = require('anatomy.train.checkpoint')
local Run = require('anatomy.train.Run')
local train_log = require('anatomy.train.log')

local train = {
  evaluate = require 'anatomy.train.evaluate',
  save_checkpoint = checkpoint.save,
  load_checkpoint = checkpoint.load,
  find_nonfinite = Trainer.find_nonfinite,
  read_metrics = train_log.read,  -- the JSON-lines log train.fit writes (train/log.lua)
  export_metrics = train_log.export,
  options = config.listing,
  Run = Run,
}

-- train.fit(model, corpus, opts) -> run (a train.Run). opts: print(train.options)
-- lists each with its default (lua/anatomy/train/config.lua): steps, batch, seq,
-- lr, weight_decay, betas, warmup, schedule, clip, eval_every, eval_batches,
-- log_every, seed, checkpoint, checkpoint_every, resume, on_step, log, decay,
-- quiet, recurrence, probe, seconds, dtype, cuda_graph, bucket_mb.
-- Under a world of N ranks (anatomy --nproc N, or a launcher's environment),
-- batch is each rank's: rank 0's weights are broadcast, every rank draws the
-- N x batch rows of one random stream and trains on its own, gradients are
-- averaged in buckets as backward produces them, the loss and evaluation are
-- averaged over the ranks, and rank 0 alone prints, logs and checkpoints;
-- resuming needs the same N. run.communication = {buckets, wait_seconds, seconds}.
function train.fit(model, corpus, opts)
  local o = config.resolve(opts, model, dist.world_size())
  local trainer = Trainer.new(model, corpus, o)
  trainer:resume()
  trainer:prepare()
  if o.cuda_graph then
    -- every step on one side stream, the warm-up steps as the captured one
    -- (host/cuda/cuda.h: a captured backward must not join the legacy stream)
    torch.cuda.side_stream(trainer.loop, trainer)
  else
    trainer:loop()
  end
  return trainer:close()
end

-- train.fit evaluates the model with whatever its caller attached (training with a layer skipped is a choice)
require('anatomy.probe.hooks').analysis(train.fit)

return train
