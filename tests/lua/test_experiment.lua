-- Provenance records, the experiments' data rule (the claim's text, found and
-- checked by SHA-256, or verdicts that say 'not comparable'), and sweeps.
package.path = (arg[0]:match('^(.*)/') or '.') .. '/?.lua;' .. package.path
local H = require('harness')
local test, eq, raises = H.test, H.eq, H.raises
local json = require('anatomy.io.json')

local tmpfile = H.tmpfile

local function contains(s, part, what)
  if not tostring(s):find(part, 1, true) then error(('%s: expected to contain %q, got %q'):format(what or 'text', part, tostring(s)), 2) end
end

test('SHA-256 of known inputs (FIPS 180-2 examples) and file facts', function()
  eq(data.sha256(''), 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855', 'sha256 of the empty string')
  eq(data.sha256('abc'), 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad', "sha256 of 'abc'")
  eq(data.sha256('abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq'),
    '248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1', 'sha256 of the two-block message')
  -- a file larger than the 1 MiB read buffer, so that the pieces are joined right
  local big = ('a'):rep(1000000) .. ('b'):rep(1000000)
  local path = tmpfile(big)
  local info = data.file_info(path)
  eq(info.bytes, 2000000, 'bytes')
  eq(info.sha256, data.sha256(big), 'the file hashed in pieces equals the string hashed at once')
  eq(info.path:sub(1, 1), '/', 'absolute path')
  os.remove(path)
  raises(function() data.file_info('/no/such/file.txt') end, "cannot resolve '/no/such/file.txt': No such file or directory")
  raises(function() data.file_info('/tmp') end, "'/tmp' is a directory")
  raises(function() data.sha256(42) end, "bad argument #1 to 'data.sha256' (string expected, got number)")
end)

test('the provenance record: data, vocabulary, model config and parameters, training, software, machine', function()
  local text = ('to be or not to be, that is the question. '):rep(60)
  local path = tmpfile(text)
  local corpus = data.text(path)
  local model = models.gpt{vocab = corpus.vocab_size, dim = 16, heads = 2, layers = 1, seq = 16, ffn = 32}
  local run = train.fit(model, corpus, {steps = 3, batch = 4, seq = 16, seed = 7, quiet = true, eval_every = 3})
  local rec = provenance.record{corpus = corpus, model = model, run = run, config = {seed = 7, steps = 3, note = 'x'}}
  eq(rec.data.sha256, data.sha256(text), 'data sha256')
  eq(rec.data.bytes, #text, 'data bytes')
  eq(rec.data.vocab_size, 15, "vocabulary: the 15 distinct characters of the text")
  eq(rec.data.vocab_size, corpus.vocab_size, 'vocabulary')
  eq(rec.data.tokenizer, 'char')
  eq(rec.model.parameters, model:num_parameters(), 'parameter count')
  eq(rec.model.config.dim, 16, 'model config')
  eq(rec.model.config.layers, 1, 'model config')
  eq(rec.model.class, 'models.GPT')
  eq(rec.training.steps, 3, 'training steps')
  eq(rec.training.batch, 4, 'batch')
  eq(rec.training.seed, 7, 'seed')
  eq(rec.seed, 7, 'seed')
  eq(rec.config.note, 'x', "the script's config")
  eq(rec.threads, torch.get_num_threads(), 'threads')
  eq(rec.device, torch.device(), 'the device it ran on')
  eq(rec.dtype, 'float32')
  eq(rec.libtorch, torch.libtorch_version)
  assert(type(rec.commit) == 'string' and #rec.commit > 0, 'commit')
  assert(rec.machine.cores and rec.machine.cores >= 1, 'cores')
  assert(rec.wall_seconds >= 0, 'wall time')
  local line = provenance.line(rec)
  contains(line, rec.data.sha256:sub(1, 16), 'line')
  contains(line, nn.format_count(model:num_parameters()) .. ' parameters', 'line')
  contains(line, 'LibTorch ' .. torch.libtorch_version, 'line')
  -- the JSON round-trips through a real JSON reader (Python's, if present, is not needed: the encoder is tested elsewhere)
  contains(json.encode(rec), '"sha256":"' .. rec.data.sha256 .. '"', 'json')
  -- without a training run the missing seed is not train.fit's
  local function seed_text(r) for _, f in ipairs(provenance.fields(r)) do if f[1] == 'seed' then return f[2] end end end
  eq(seed_text(provenance.record{model = model}), 'none recorded (no training run in this record)')
  eq(seed_text(provenance.record{model = model, run = {train = {1}, val = {}, config = {}}}), 'not given (train.fit ran without a seed)')
  os.remove(path)
end)

test('the autopsy carries the provenance record into its JSON and its report', function()
  local corpus = data.from_string(('abcd efgh '):rep(200))
  local model = models.vibenet{vocab = corpus.vocab_size, dim = 16, layers = 2, seq = 16}
  local run = train.fit(model, corpus, {steps = 2, batch = 4, seq = 16, quiet = true, eval_every = 2})
  local a = autopsy.run(model, corpus, {history = run, batch = 4, seq = 16, config = {label = 'test'}})
  eq(a.provenance.data.sha256, data.sha256(('abcd efgh '):rep(200)), 'autopsy provenance data')
  eq(a.provenance.config.label, 'test')
  local dir = os.tmpname()
  os.remove(dir)
  local s = H.read(a:json(dir .. '/a.json'))
  contains(s, '"provenance":{', 'autopsy JSON')
  local html = require('anatomy.autopsy.report').html(a)
  contains(html, 'class="provenance"', 'report')
  contains(html, a.provenance.data.sha256:sub(1, 16), 'report')
  os.execute("rm -rf '" .. dir .. "'")
end)

test('verdicts stand on the claim\'s data and read "not comparable" on any other', function()
  local r = experiment.results('t', {comparable = true, name = 'tinyshakespeare.txt'})
  r:add('a', '~1', 1.0, 'reproduced')
  r:add('b', '~2', 3.0, 'differs')
  eq(r.rows[1].verdict, 'reproduced')
  eq(r.rows[2].verdict, 'differs')
  local w = experiment.results('t', {comparable = false, name = 'kjv.txt'})
  w:add('a', '~1', 1.0, 'reproduced')
  w:add('b', '~2', 3.0, 'differs')
  w:add('c', '(compare)', 2.0, 'measured')
  for i = 1, 3 do eq(w.rows[i].verdict, 'not comparable (data: kjv.txt)', 'row ' .. i) end
  contains(tostring(w), '| not comparable (data: kjv.txt) |', 'printed table')
end)

-- A dataset of our own, in a folder of our own, so that these tests need no shared data.
local function own_dataset()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute(("mkdir -p '%s'"):format(dir)) == 0)
  local text = ('It is a truth universally acknowledged, that a single man in possession. '):rep(200)
  local path = dir .. '/austen.txt'
  local f = assert(io.open(path, 'wb'))
  f:write(text)
  f:close()
  experiment.datasets.austen = {name = 'Austen', file = 'austen.txt', bytes = #text, sha256 = data.sha256(text)}
  experiment.data_path = {dir}
  return dir, path, text
end

local function forget(dir)
  experiment.datasets.austen, experiment.data_path = nil, {}
  os.execute(("rm -rf '%s'"):format(dir))
end

test('experiment.corpus: the claim\'s text is found and known by its SHA-256, not its name', function()
  local dir, path = own_dataset()
  -- found by the search, with no --data
  local c, d = experiment.corpus({data = ''}, {dataset = 'austen'})
  eq(d.comparable, true, 'found in the search path')
  eq(d.path, data.file_info(path).path)
  eq(d.dataset, 'Austen')
  local distinct = {}
  for ch in H.read(path):gmatch('.') do distinct[ch] = true end
  local n = 0
  for _ in pairs(distinct) do n = n + 1 end
  eq(c.vocab_size, n, 'a char corpus of the text: one id per distinct character')
  -- the same bytes under another name and folder count as the claim's data
  local copy = os.tmpname()
  assert(os.execute(("cp '%s' '%s'"):format(path, copy)) == 0)
  local _, d1 = experiment.corpus({data = copy}, {dataset = 'austen'})
  eq(d1.comparable, true, 'a renamed copy is comparable')
  -- one byte more: another text
  local f = assert(io.open(copy, 'ab'))
  f:write('x')
  f:close()
  local _, d2 = experiment.corpus({data = copy}, {dataset = 'austen'})
  eq(d2.comparable, false, 'a different text is not comparable')
  contains(d2.note, "every verdict reads 'not comparable'", 'note')
  -- a file with the dataset's name but other bytes is refused, not used
  assert(os.execute(("cp '%s' '%s/austen.txt'"):format(copy, dir)) == 0)
  local ok, err = pcall(experiment.corpus, {data = ''}, {dataset = 'austen'})
  eq(ok, false, 'must fail')
  contains(err, '/austen.txt is not Austen (sha256 ' .. data.sha256(H.read(copy)), 'error')
  contains(err, "---> HINT: pass --data=", 'error')
  os.remove(copy)
  forget(dir)
end)

test('Tiny Shakespeare beside the checkout is the claims\' text (65 characters)', function()
  local ts = experiment.find_data('tinyshakespeare')
  if not ts then H.skip('no shared/data/tinyshakespeare.txt beside this checkout') end
  local c, d = experiment.corpus({data = ''})
  eq(d.comparable, true)
  eq(d.path, data.file_info(ts).path)
  eq(c.vocab_size, 65, 'vocabulary of Tiny Shakespeare')
  eq(data.file_info(ts).bytes, experiment.datasets.tinyshakespeare.bytes, 'bytes')
end)

test('experiment.corpus stops, saying where it looked, when the claim\'s text is missing', function()
  experiment.datasets.missing_text = {name = 'A Missing Text', file = 'no-such-text-anywhere.txt', sha256 = ('0'):rep(64)}
  local ok, err = pcall(experiment.corpus, {data = ''}, {dataset = 'missing_text'})
  eq(ok, false, 'must fail')
  contains(err, 'were made on A Missing Text (no-such-text-anywhere.txt), which was not found; looked in:', 'error')
  for _, dir in ipairs(experiment.data_dirs()) do contains(err, dir .. '/no-such-text-anywhere.txt', 'error lists every folder') end
  contains(err, '---> HINT: --data=PATH/no-such-text-anywhere.txt, or ANATOMY_DATA=FOLDER', 'error')
  -- a smoke run may fall back to the default corpus, and says so; where the
  -- default corpus cannot be made (no bible-kjv, as on the GPU machine) that
  -- is the error, naming the package
  local ok2, err2, d = pcall(experiment.corpus, {data = '', smoke = true}, {dataset = 'missing_text'})
  if ok2 then
    eq(d.comparable, false, 'smoke fallback is not comparable')
    contains(d.note, 'smoke run on the default corpus', 'note')
  else
    contains(tostring(err2), 'the default corpus needs the `bible` program', 'error')
    contains(tostring(err2), 'apt-get install bible-kjv', 'hint')
  end
  experiment.datasets.missing_text = nil
  local ok3, err3 = pcall(experiment.corpus, {data = '/no/such/text.txt'})
  eq(ok3, false)
  contains(err3, 'cannot open --data=/no/such/text.txt', 'error')
end)

test('experiment.sweep runs the Cartesian product in order and tabulates what it measured', function()
  local calls = {}
  local s = experiment.sweep({{'layers', {1, 2, 4}}, {'residual', {true, false}}}, function(cfg)
    calls[#calls + 1] = cfg.layers .. (cfg.residual and '+' or '-')
    eq(cfg.base_key, 'kept', 'base settings reach fn')
    return {loss = cfg.layers * (cfg.residual and 1 or 2) + 0.5, tag = cfg.residual and 'r' or 'n'}
  end, {base = {base_key = 'kept'}, quiet = true})
  eq(calls, {'1+', '1-', '2+', '2-', '4+', '4-'}, 'the first key varies slowest')
  eq(s.keys, {'layers', 'residual'})
  eq(s.measured, {'loss', 'tag'}, 'measured columns, sorted')
  eq(#s.rows, 6)
  eq(s.rows[4].layers, 2)
  eq(s.rows[4].residual, false)
  eq(s.rows[4].loss, 4.5)
  eq(s:numeric_columns(), {'loss'})
  local md = s:markdown()
  contains(md, '| layers | residual | loss  | tag |', 'markdown header')
  contains(md, '| 2      | false    | 4.500 | n   |', 'markdown row')
  contains(tostring(s), '4     false  8.500    n', 'printed row')
  local series = s:series('loss')
  eq(#series, 2, 'one series per residual setting')
  eq(series[1][1], 'residual=true')
  eq(series[2][3], {2.5, 4.5, 8.5}, 'loss against layers without residuals')
  local svg = s:svg('loss', 'demo')
  contains(svg, 'data-points="6"', 'svg points')
  contains(svg, '<svg xmlns="http://www.w3.org/2000/svg"', 'standalone svg')
  raises(function() s:svg('nope') end, "bad argument #1 to 'svg' (no measured column 'nope'; the columns are loss, tag)")
  -- in a notebook: the table and its chart, as one fragment under its own scope
  local shown = require('anatomy.session.kernel').mimebundle(s)
  contains(shown['text/html'], '<div class="anatomy-output">', 'a fragment')
  contains(shown['text/html'], '<td>4</td><td>false</td><td>8.500</td><td>n</td>', 'the table')
  contains(shown['text/html'], 'data-points="6"', 'the chart')
  contains(shown['text/plain'], '4     false  8.500    n', 'and its text')
  local path = os.tmpname()
  s:json(path)
  contains(H.read(path), '"keys":["layers","residual"]', 'json')
  os.remove(path)
  -- keyed grids take sorted keys (or opts.order)
  local order = {}
  experiment.sweep({b = {1, 2}, a = {'x'}}, function(cfg) order[#order + 1] = cfg.a .. cfg.b return {v = 1} end, {quiet = true})
  eq(order, {'x1', 'x2'})
  raises(function() experiment.sweep({a = {}}, function() return {} end, {quiet = true}) end, 'experiment.sweep: grid.a has no values')
  raises(function() experiment.sweep({a = {1}}, function() return 3 end, {quiet = true}) end,
    'experiment.sweep: fn must return a table of measured values, got number for a=1')
  raises(function() experiment.sweep({a = {1}}, 'f') end, 'experiment.sweep: fn must be a function, got string')
end)

test('results:save writes results.json and results.md with the provenance line and the sweep charts', function()
  local corpus = data.from_string(('abc '):rep(100))
  local r = experiment.results('A test', {comparable = true, name = '(string)'})
  r:add('claim', '~1', 1.25, 'reproduced')
  r:note('a note')
  local s = experiment.sweep({{'n', {1, 2}}}, function(cfg) return {y = cfg.n * 2} end, {quiet = true})
  r:sweep('Tiny sweep', s)
  local dir = os.tmpname()
  os.remove(dir)
  local jp, mp = r:save(dir, {corpus = corpus, config = {seed = 3}, name = 'unit'})
  local md = H.read(mp)
  contains(md, '### A test', 'md title')
  contains(md, '| claim | ~1        | 1.250 | reproduced |', 'md row')
  contains(md, 'a note', 'md note')
  contains(md, '#### Tiny sweep', 'md sweep')
  contains(md, '![unit_tiny_sweep_y.svg](unit_tiny_sweep_y.svg)', 'md chart')
  contains(md, '<sub>data (string) (400 bytes, sha256 ' .. data.sha256(('abc '):rep(100)):sub(1, 16), 'md provenance')
  local js = H.read(jp)
  contains(js, '"name":"unit"', 'json name')
  contains(js, '"verdict":"reproduced"', 'json row')
  contains(js, '"seed":3', 'json provenance config')
  -- the data's file by name only: no path of the machine that ran it
  local r2 = experiment.results('Paths', {comparable = true, name = 'text.txt', path = '/home/someone/data/text.txt',
    note = 'data: /home/someone/data/text.txt (Some text, sha256 0123)'})
  local jp2 = r2:save(dir .. '/paths', {corpus = corpus, name = 'paths'})
  local js2 = H.read(jp2)
  eq(js2:find('/home/someone', 1, true), nil, 'results.json names no absolute path')
  contains(js2, '"note":"data: text.txt (Some text, sha256 0123)"', 'the note names the file')
  eq(r2.data.path, '/home/someone/data/text.txt', 'the results keep the path in the session')
  assert(io.open(dir .. '/unit_tiny_sweep_y.svg', 'rb'), 'chart written')
  os.execute("rm -rf '" .. dir .. "'")
end)

test('json.decode reads what json.encode writes, and names the byte of a malformed text', function()
  local value = {name = 'a "quoted" \\ name\n', list = {1, 2.5, -3e-7, true, false}, nested = {x = {y = 'z'}}}
  local back = json.decode(json.encode(value))
  eq(back.name, value.name)
  eq(back.list, value.list)
  eq(back.nested.x.y, 'z')
  eq(json.decode('"\\u00e9\\ud83d\\ude00"'), 'é😀', 'escapes, a surrogate pair too')
  eq(json.decode(' [null] ')[1], json.null)
  raises(function() json.decode('[1, 2') end, "json.decode: expected ',' or ']' at byte 6")
  raises(function() json.decode('{"a": }') end, "json.decode: unexpected '}' at byte 7")
  raises(function() json.decode('[1] x') end, 'json.decode: trailing characters at byte 5')
  raises(function() json.decode(42) end, "bad argument #1 to 'decode' (string expected, got number)")
end)

test('experiment.config reads the commit at once, before the run writes its results into the checkout', function()
  local provenance = require('anatomy.io.provenance')
  local real, calls = provenance.commit, 0
  provenance.commit = function() calls = calls + 1 return real() end
  local ok, err = pcall(experiment.config, {steps = 3}, {steps = 1}, {})
  provenance.commit = real
  if not ok then error(err, 0) end
  eq(calls, 1, 'the commit is read (and kept) when the configuration is')
end)

H.done()
