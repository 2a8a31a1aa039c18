-- train.fit's data parallelism (a world of several ranks): every rank starts
-- from rank 0's weights, draws the batch of all ranks from one random stream
-- and trains on its own rows; gradients are averaged in buckets as backward
-- produces them (host/dist/reducer.cpp), the loss and the evaluation are
-- averaged over the ranks, and rank 0 alone prints, logs and checkpoints.
-- With one rank every function here is the identity or does nothing.
local torch = require('anatomy.torch')
local native = require('anatomy.torch.native')
local dist = require('anatomy.torch.dist')
local options = require('anatomy.torch.options')
local parallel = {}

-- parallel.setup(params, o) -> world, rank, reducer (nil with one rank):
-- rank 0's weights broadcast, the reducer made, the other ranks quiet.
function parallel.setup(params, o)
  local world, rank = dist.world_size(), dist.rank()
  local reducer
  if world > 1 then
    for _, p in ipairs(params) do dist.broadcast(p, 0) end
    reducer = native.dist._reducer(params, o.bucket_mb or 25)
    o.quiet = o.quiet or rank ~= 0  -- rank 0 alone prints, logs and checkpoints
  end
  return world, rank, reducer
end

-- parallel.check_resume(o, world, resuming): every rank must see the
-- checkpoint rank 0 wrote (one machine, or a shared file system).
function parallel.check_resume(o, world, resuming)
  if world == 1 or not (o.checkpoint and o.resume) then return end
  local found = dist.all_gather(torch.tensor({resuming and 1 or 0}))
  for r, f in ipairs(found) do
    if f:item() ~= found[1]:item() then
      error(('train.fit: rank %d %s the checkpoint %s, rank 0 %s: resuming needs it on a file system every rank reads')
        :format(r - 1, f:item() == 1 and 'finds' or 'does not find', o.checkpoint, found[1]:item() == 1 and 'does' or 'does not'), options.user_level())
    end
  end
end

-- parallel.check_world(path, meta, world): a checkpoint resumes only in a
-- world of the ranks that wrote it (each rank's batch is its share of one
-- random stream).
function parallel.check_world(path, meta, world)
  local saved_world = tonumber(meta['config.world_size']) or 1
  if saved_world ~= world then
    error(('train.fit: the checkpoint %s was written by a run of %d rank%s; resume it with the same number (this run has %d): each rank\'s batch is its share of one random stream')
      :format(path, saved_world, saved_world == 1 and '' or 's', world), options.user_level())
  end
end

-- parallel.rows(x, y, rank, batch, world) -> this rank's rows of the batch of all ranks
function parallel.rows(x, y, rank, batch, world)
  if world == 1 then return x, y end
  return x:narrow(1, rank * batch + 1, batch), y:narrow(1, rank * batch + 1, batch)
end

-- parallel.average_loss(r): the step's loss, averaged over the ranks (the
-- gradients already are, once the reducer has finished). Alike on every
-- rank by construction: no comparison of the call between ranks (a round
-- trip a step).
function parallel.average_loss(r)
  local mean = native.dist.all_reduce(r.loss:clone(), 'avg', false)
  r.loss, r.value = mean, mean:item()
  if r.depth_losses then r.depth_losses[#r.depth_losses] = r.value end
end

-- parallel.share(x, y, world) -> this rank's share of the evaluation
-- windows x, y (its part of the windows one process would judge).
function parallel.share(x, y, world)
  local rank = dist.rank()
  local n = x:size(1)
  local first, last = math.floor(n * rank / world) + 1, math.floor(n * (rank + 1) / world)
  if last < first then return nil end
  return x:narrow(1, first, last - first + 1), y:narrow(1, first, last - first + 1)
end

-- parallel.sum(total, count) -> total and count added over the ranks
function parallel.sum(total, count)
  local sums = dist.all_reduce(torch.tensor({total, count}, {dtype = 'float64'}), {op = 'sum'}):tolist()
  return sums[1], sums[2]
end

-- parallel.finish(run, reducer): the run's communication figures
-- ({buckets, wait_seconds, seconds}), and the reducer released.
function parallel.finish(run, reducer)
  if not reducer then return end
  local waited, communicated = reducer:stats()
  run.communication = {buckets = reducer:buckets(), wait_seconds = waited, seconds = communicated}
  reducer:release()
end

return parallel
