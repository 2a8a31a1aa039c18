-- The activation store: a point's activations over a corpus, gathered by
-- forwards that stop once the point has been computed, shuffled through a
-- buffer of many batches (rows of one sequence are far from independent),
-- and handed out batch by batch. With a cache folder, what was gathered is
-- written as safetensors shards beside a manifest and read back by the next
-- store on the same model, point and text, which then runs the model only
-- for rows beyond them. A transcoder's store holds a module's input and
-- output (x, y) side by side.
-- B sequences per forward, T their length, D the point's width, N rows.
local torch = require('anatomy.torch')
local points = require('anatomy.probe.points')
local hooks = require('anatomy.probe.hooks')
local json = require('anatomy.io.json')
local fs = require('anatomy.io.fs')
local Store = {}
Store.__index = Store

local STOP = 'anatomy.features: the point is computed, the rest of the forward is not needed'

-- store.gather(model, point, ids, transcoder) -> x (N, D)[, y (N, D)]: the
-- point's activations over ids (B, T), rows in (b, t) order; a
-- transcoder's are the module's input and output. The forward stops at the
-- point (an error the store raises and catches).
function Store.gather(model, point, ids, transcoder)
  local x, y
  local handle = hooks.replace(model, point, function(t, _, input)
    if transcoder then x, y = input, t else x = t end
    error(STOP, 0)
  end)
  local ok, err = pcall(torch.no_grad, function() return model(ids) end)
  handle:remove()
  if not ok and not tostring(err):find(STOP, 1, true) then error(err, 0) end
  if x == nil then error(("sae: the forward never reached '%s'"):format(point), 0) end
  local D = x:size(-1)
  x = x:detach():reshape({-1, D}):float()
  if transcoder then y = y:detach():reshape({-1, y:size(-1)}):float() end
  return x, y
end

-- store.gather_layers(model, locs, ids) -> x (N, L, D), y (N, L, D): every
-- layer's transcoder input and output (features/clt_splice.lua's
-- locations) over ids, rows in (b, t) order, from one forward that stops
-- once the last layer's output is computed.
function Store.gather_layers(model, locs, ids)
  local xs, ys, handles = {}, {}, {}
  local L = #locs
  for l, loc in ipairs(locs) do
    if loc.from_module_input and loc.input == loc.output then
      handles[#handles + 1] = hooks.replace(model, loc.output, function(t, _, input)
        xs[l], ys[l] = input, t
        if l == L then error(STOP, 0) end
      end)
    else
      handles[#handles + 1] = hooks.replace(model, loc.input, function(t, _, input) xs[l] = loc.from_module_input and input or t end)
      handles[#handles + 1] = hooks.replace(model, loc.output, function(t)
        ys[l] = t
        if l == L then error(STOP, 0) end
      end)
    end
  end
  local ok, err = pcall(torch.no_grad, function() return model(ids) end)
  for _, h in ipairs(handles) do h:remove() end
  if not ok and not tostring(err):find(STOP, 1, true) then error(err, 0) end
  for l = 1, L do
    if not xs[l] or not ys[l] then error(("sae: the forward never reached layer %d's '%s'"):format(l, xs[l] and locs[l].output or locs[l].input), 0) end
    xs[l] = xs[l]:detach():reshape({-1, xs[l]:size(-1)}):float()
    ys[l] = ys[l]:detach():reshape({-1, ys[l]:size(-1)}):float()
  end
  return torch.stack(xs, 2), torch.stack(ys, 2)
end

-- What a cache's activations depend on: the model's weights (the SHA-256 of
-- their names, dtypes, shapes and values, as a saved lens records them), the
-- point, the text and how it is cut; a cache written for anything else is an
-- error, never reused.
local function fingerprint(model, point, corpus, o)
  local state = {}
  for name, p in model:named_parameters() do state[name] = p end
  local info = corpus.file_info and corpus:file_info() or {}
  return {point = point, transcoder = o.transcoder == true, weights_sha256 = torch.tensors_sha256(state),
    text_sha256 = info.sha256, seq = o.seq, batch = o.batch, seed = o.seed}
end

-- Store.new(model, corpus, point, o) -> a store. o: seq (T), batch (B),
-- buffer (rows shuffled together), transcoder, layers (a CLT's locations:
-- rows of every layer's input and output), cache (a folder or nil), where
-- (the function its errors name; default 'sae.train'), seed
-- (the store's own generator stream: batches drawn from the corpus and the
-- shuffles follow torch.manual_seed(seed) at creation).
function Store.new(model, corpus, point, o)
  local self = setmetatable({model = model, device = model:device(), corpus = corpus, point = point, o = o, shards_read = 0,
    shards_written = 0, rows_gathered = 0, rows_from_cache = 0}, Store)
  if o.cache then
    self.key = fingerprint(model, point, corpus, o)
    local manifest = o.cache .. '/manifest.json'
    if fs.exists(manifest) then
      local ok, m = pcall(json.decode, fs.read(manifest))
      if not ok or type(m) ~= 'table' or type(m.key) ~= 'table' then
        error(('%s: %s is not an activation cache manifest'):format(o.where or 'sae.train', manifest), 0)
      end
      for k, v in pairs(self.key) do
        if m.key[k] ~= v then
          error(("%s: the activation cache %s was written for %s = %s; this run has %s (another folder, or remove it)"):format(o.where or 'sae.train',
            o.cache, k, tostring(m.key[k]), tostring(v)), 0)
        end
      end
      self.shards = m.shards or {}
    else
      fs.mkdir(o.cache)
      self.shards = {}
    end
  end
  return self
end

-- The next chunk of rows: from the cache's next shard while there is one,
-- else from the model (written as a shard when caching). A cache is read in
-- the order it was written; a run that needs more rows adds shards.
function Store:chunk()
  local o = self.o
  if self.shards and self.shards_read < #self.shards then
    self.shards_read = self.shards_read + 1
    local t = torch.load_safetensors(o.cache .. '/' .. self.shards[self.shards_read])
    self.rows_from_cache = self.rows_from_cache + t.x:size(1)
    -- the sequences the model would have been given are drawn all the same, so a run reads the corpus as it did
    self.corpus:batch(o.batch, o.seq, {device = 'cpu'})
    -- a shard reads onto the default device; the rows belong on the model's
    return t.x:to(self.device), t.y and t.y:to(self.device)
  end
  local ids = self.corpus:batch(o.batch, o.seq, {device = self.device})
  local x, y
  if o.layers then x, y = Store.gather_layers(self.model, o.layers, ids) else x, y = Store.gather(self.model, self.point, ids, o.transcoder) end
  self.rows_gathered = self.rows_gathered + x:size(1)
  if self.shards then
    local name = ('shard_%05d.safetensors'):format(#self.shards + 1)
    torch.save_safetensors(o.cache .. '/' .. name, {x = x, y = y}, {format = 'anatomy.activations'})
    self.shards[#self.shards + 1] = name
    self.shards_read = #self.shards
    fs.write_atomic(o.cache .. '/manifest.json', json.encode({key = self.key, shards = self.shards}) .. '\n')
  end
  return x, y
end

-- store:next(n) -> x (n, D)[, y (n, D)]: the next n rows, from a buffer of at
-- least o.buffer rows refilled and shuffled when it runs short
function Store:next(n)
  local o = self.o
  if not self.x or self.x:size(1) - self.at + 1 < n then
    local xs, ys = {}, {}
    local have = 0
    local left = self.x and self.x:size(1) - self.at + 1 or 0
    if left > 0 then
      xs[1] = self.x:narrow(1, self.at, left)
      ys[1] = self.y and self.y:narrow(1, self.at, left)
      have = left
    end
    while have < math.max(o.buffer, n) do
      local x, y = self:chunk()
      xs[#xs + 1], ys[#xs + 1] = x, y
      have = have + x:size(1)
    end
    local order = select(2, torch.rand(have, {device = xs[1].device}):sort())  -- a random permutation
    self.x = torch.cat(xs, 1):index_select(1, order)
    self.y = o.transcoder and torch.cat(ys, 1):index_select(1, order) or nil
    self.at = 1
  end
  local x = self.x:narrow(1, self.at, n)
  local y = self.y and self.y:narrow(1, self.at, n)
  self.at = self.at + n
  return x, y
end

Store.points = points
return Store
