-- kernel: the Lua half of `anatomy --kernel` (embed/kernel.cpp speaks
-- Jupyter's protocol; this file answers its requests). A cell runs as a REPL
-- line does, in the same globals: a trailing expression is the cell's result,
-- print and io.write stream to the notebook while the cell runs, io.read asks
-- the notebook for a line (where the frontend allows input), and an error
-- is reported with its traceback while the session keeps its variables.
-- Rich output: display(x), and any value with a _repr_mimebundle() method
-- (an autopsy, its charts, a comparison) shows as HTML or SVG.
local torch = require('anatomy.torch')
local native = require('anatomy.torch.native')
local json = require('anatomy.io.json')
local repl = require('anatomy.session.repl')
local page = require('anatomy.render.page')
local help = require('anatomy.session.help')
local O = json.object  -- {} that must be a JSON object

local kernel = {}

local send        -- send(msg_type, content): an iopub message for the request being answered
local input       -- input(prompt, password) -> a line typed in the notebook (stdin channel)
local allow_stdin = false  -- whether the request being answered accepts input
local count = 0   -- execution_count
local history = {}  -- this session's cells: {line = execution count, input = code}

-- kernel.mimebundle(x) -> {['text/plain'] = ..., ['text/html'] = ..., ...}
function kernel.mimebundle(x)
  local bundle = O()
  local method = type(x) == 'table' and x._repr_mimebundle
  if type(method) == 'function' then
    local ok, b = pcall(method, x)
    if ok and type(b) == 'table' then
      for k, v in pairs(b) do bundle[k] = v end
    elseif not ok then
      bundle['text/plain'] = 'display: _repr_mimebundle failed: ' .. tostring(b)
    end
  end
  -- results drawn in reports: a comparison's html(), patching's and attribution's svg() (a <figure>)
  if type(x) == 'table' and type(method) ~= 'function' then
    for _, name in ipairs{'html', 'svg'} do
      local ok, f = pcall(function() return x[name] end)
      if ok and type(f) == 'function' and not bundle['text/html'] then
        local good, h = pcall(f, x)
        if good and type(h) == 'string' then bundle['text/html'] = h end
      end
    end
  end
  -- a whole page (a report, a comparison) becomes a fragment whose style touches only itself
  local html = bundle['text/html']
  if type(html) == 'string' and html:match('^%s*<!DOCTYPE') then
    bundle['text/html'] = page.embed(html)
  end
  bundle['text/plain'] = bundle['text/plain'] or repl.render(x)
  return bundle
end

-- display(x, ...): shows each value in the notebook (HTML or SVG where it has one).
function kernel.display(...)
  for i = 1, select('#', ...) do
    send('display_data', {data = kernel.mimebundle((select(i, ...))), metadata = O(), transient = O()})
  end
end

local function stream(name)
  return function(text)
    text = text:gsub('\27%[K', '')  -- the terminal's erase-line: a '\r' already rewrites the line here
    if text ~= '' then send('stream', {name = name, text = text}) end
  end
end

-- The traceback of a cell's error without the kernel's own frames.
local function cell_traceback(msg)
  local lines = {}
  for line in (debug.traceback(msg, 3) .. '\n'):gmatch('([^\n]*)\n') do
    if line:match("in function 'xpcall'") then break end
    if not line:match('^%s*%[builtin#') then lines[#lines + 1] = line end
  end
  return table.concat(lines, '\n')
end

-- io.read(...) in a cell: each format asks the notebook for a line (an
-- input_request on the stdin channel). Formats as Lua's: 'l' (the default),
-- 'L' (with its newline), 'n' (a number, or nil), 'a' (the line), or a count
-- of characters.
local function read(...)
  if not allow_stdin then
    error('io.read: this frontend does not take input (its execute request has allow_stdin = false, as nbconvert ' ..
      'sends): set the value in the cell instead', 2)
  end
  local formats = select('#', ...) == 0 and {'l'} or {...}
  local values = {}
  for i, f in ipairs(formats) do
    local line = input('', false)
    if type(f) == 'number' then
      values[i] = line:sub(1, f)
    else
      local kind = type(f) == 'string' and f:gsub('^%*', ''):sub(1, 1)
      if kind == 'l' or kind == 'a' then values[i] = line
      elseif kind == 'L' then values[i] = line .. '\n'
      elseif kind == 'n' then values[i] = tonumber(line)
      else error(("bad argument #%d to 'read' (invalid format %s)"):format(i, tostring(f)), 2) end
    end
  end
  return unpack(values, 1, #formats)
end

-- io.stdin:lines(...) and io.lines() in a cell: an iterator of read(...)
local function lines(...)
  local formats = {n = select('#', ...), ...}
  return function() return read(unpack(formats, 1, formats.n)) end
end

-- Runs fn with print, io.write and io.stderr sending to the notebook, and
-- io.read asking it for input.
local function with_output(fn)
  local out, err = stream('stdout'), stream('stderr')
  local saved_print, saved_write, saved_stdout, saved_stderr = print, io.write, io.stdout, io.stderr
  local saved_read, saved_stdin, saved_lines = io.read, io.stdin, io.lines
  local saved_isatty = native.isatty
  local proxy = function(target, emit)
    return setmetatable({}, {__index = function(_, k)
      if k == 'read' and not emit then return function(_, ...) return read(...) end end
      if k == 'lines' and not emit then return function(_, ...) return lines(...) end end
      if k == 'write' and emit then
        return function(self, ...)
          local parts = {}
          for i = 1, select('#', ...) do parts[i] = tostring((select(i, ...))) end
          emit(table.concat(parts))
          return self
        end
      end
      local v = target[k]
      if type(v) == 'function' then return function(_, ...) return v(target, ...) end end
      return v
    end})
  end
  _G.print = function(...)
    local parts = {}
    for i = 1, select('#', ...) do parts[i] = tostring((select(i, ...))) end
    out(table.concat(parts, '\t') .. '\n')
  end
  io.write = function(...)
    local parts = {}
    for i = 1, select('#', ...) do parts[i] = tostring((select(i, ...))) end
    out(table.concat(parts))
    return io.stdout
  end
  io.stdout = proxy(saved_stdout, out)
  io.stderr = proxy(saved_stderr, err)
  io.read = read
  io.stdin = proxy(saved_stdin)
  io.lines = function(name, ...)  -- io.lines() without a file reads the notebook's input too
    if name ~= nil then return saved_lines(name, ...) end
    return lines(...)
  end
  native.isatty = function(fd) return fd == 1 end  -- progress lines rewrite themselves with '\r'
  local function pack(...) return {n = select('#', ...), ...} end
  local results = pack(xpcall(fn, function(e)
    local msg = tostring(e)
    return {message = msg, traceback = cell_traceback(msg)}
  end))
  _G.print, io.write, io.stdout, io.stderr, native.isatty = saved_print, saved_write, saved_stdout, saved_stderr, saved_isatty
  io.read, io.stdin, io.lines = saved_read, saved_stdin, saved_lines
  return results
end

-- Compiles a cell as the REPL does: an expression first (its value is the
-- result), else statements.
local function compile(code, name)
  local f = loadstring('return ' .. code, name)
  if f then return f end
  -- statements, then an expression on the last line: its value is the result
  local head, last = code:match('^(.*\n)%s*([^\n]-)%s*$')
  if last and last ~= '' and not last:match('^%-%-') then
    local h = loadstring(head .. 'return ' .. last, name)
    if h then return h end
  end
  return loadstring(code, name)
end



-- The execute request's user_expressions ({name = 'Lua expression'}),
-- evaluated after the cell: each its value's mimebundle, or its error.
local function user_expressions(expressions)
  local out = O()
  if type(expressions) ~= 'table' then return out end
  for name, code in pairs(expressions) do
    local f, err = loadstring('return ' .. tostring(code), '=user_expressions.' .. tostring(name))
    local ok, value
    if f then ok, value = pcall(f) else ok, value = false, err end
    out[name] = ok and {status = 'ok', data = kernel.mimebundle(value), metadata = O()}
      or {status = 'error', ename = 'LuaError', evalue = tostring(value), traceback = {tostring(value)}}
  end
  return out
end

function kernel.execute(content)
  local code = content.code or ''
  local silent = content.silent
  allow_stdin = content.allow_stdin == true
  if not silent and content.store_history ~= false then
    count = count + 1
    history[#history + 1] = {line = count, input = code}
  end
  if not silent then send('execute_input', {code = code, execution_count = count}) end
  if code:match('^%s*$') then return {status = 'ok', execution_count = count, user_expressions = O(), payload = {}} end
  local f, err = compile(code, ('=cell [%d]'):format(count))
  local results
  if not f then
    results = {false, {message = err, traceback = err}, n = 2}
  else
    results = with_output(f)
  end
  if not results[1] then
    local e = results[2]
    -- a second error inside the handler (an interrupt landing there) leaves a string
    if type(e) ~= 'table' then e = {message = tostring(e), traceback = tostring(e)} end
    local interrupted = e.message:match('interrupted$') ~= nil
    local reply = {status = 'error', ename = interrupted and 'Interrupted' or (not f and 'SyntaxError' or 'LuaError'),
      evalue = e.message, traceback = {}}
    for line in (e.traceback .. '\n'):gmatch('([^\n]*)\n') do reply.traceback[#reply.traceback + 1] = line end
    if not silent then send('error', {ename = reply.ename, evalue = reply.evalue, traceback = reply.traceback}) end
    reply.execution_count = count
    return reply
  end
  if results.n > 1 and not silent and not code:match(';%s*$') then
    _G._ = results[2]
    for i = 2, results.n do
      send('execute_result', {execution_count = count, data = kernel.mimebundle(results[i]), metadata = O()})
    end
  end
  return {status = 'ok', execution_count = count, user_expressions = user_expressions(content.user_expressions),
    payload = {}}
end

-- The word that ends at the cursor (names, fields and methods: "torch.ze", "x:me").
local function word_at(code, pos)
  local before = code:sub(1, pos)
  local word = before:match('[%w_%.:]*$') or ''
  return word, pos - #word
end

function kernel.complete(content)
  local code, pos = content.code or '', content.cursor_pos or #(content.code or '')
  local word, start = word_at(code, pos)
  local matches = repl.complete(word)
  return {status = 'ok', matches = matches, cursor_start = start, cursor_end = pos, metadata = O()}
end

function kernel.inspect(content)
  local code, pos = content.code or '', content.cursor_pos or #(content.code or '')
  -- the name under the cursor: back to its start and on to its end
  local word = code:sub(1, pos):match('[%w_%.:]*$') .. (code:sub(pos + 1):match('^[%w_]*') or '')
  word = word:gsub(':', '.')
  if word == '' then return {status = 'ok', found = false, data = O(), metadata = O()} end
  local v = _G
  for part in word:gmatch('[^.]+') do
    if type(v) ~= 'table' and type(v) ~= 'userdata' then v = nil break end
    local ok, nv = pcall(function() return v[part] end)
    v = ok and nv or nil
    if v == nil then break end
  end
  if v == nil then return {status = 'ok', found = false, data = O(), metadata = O()} end
  return {status = 'ok', found = true, data = {['text/plain'] = help.text(v)}, metadata = O()}
end

function kernel.is_complete(content)
  local code = content.code or ''
  local f, err = loadstring('return ' .. code)
  if f then return {status = 'complete'} end
  f, err = loadstring(code)
  if f then return {status = 'complete'} end
  if tostring(err):match("'<eof>'$") then return {status = 'incomplete', indent = ''} end
  return {status = 'invalid'}
end

function kernel.kernel_info()
  return {
    status = 'ok', protocol_version = '5.3', implementation = 'anatomy', implementation_version = torch.version.anatomy,
    language_info = {name = 'lua', version = jit and jit.version or _VERSION, mimetype = 'text/x-lua', file_extension = '.lua',
      pygments_lexer = 'lua', codemirror_mode = 'lua'},
    banner = torch.banner(), help_links = {}, debugger = false,
  }
end

function kernel.comm_info() return {status = 'ok', comms = O()} end
-- history_request: this session's cells ({session, line, input}; session 0
-- is the current one, as in IPython), the last n ('tail'), a range of
-- execution counts ('range'), or those matching a glob ('search', * and ?).
-- Outputs are not kept (output = true gives nil in their place).
function kernel.history(content)
  local kind, n = content.hist_access_type or 'tail', tonumber(content.n)
  local function entry(h)
    if content.output then return {0, h.line, {h.input, json.null}} end
    return {0, h.line, h.input}
  end
  local picked = {}
  if kind == 'range' then
    local start, stop = tonumber(content.start) or 1, tonumber(content.stop)
    for _, h in ipairs(history) do
      if h.line >= start and (not stop or h.line < stop) then picked[#picked + 1] = h end
    end
  else
    local pattern
    if kind == 'search' then
      local glob = tostring(content.pattern or '*')
      pattern = '^' .. glob:gsub('[%^%$%(%)%%%.%[%]%+%-]', '%%%0'):gsub('%*', '.*'):gsub('%?', '.') .. '$'
    end
    local seen = {}
    for i = #history, 1, -1 do
      local h = history[i]
      if (not pattern or h.input:match(pattern)) and not (content.unique and seen[h.input]) then
        seen[h.input] = true
        table.insert(picked, 1, h)
        if n and #picked >= n then break end
      end
    end
  end
  local out = {}
  for i, h in ipairs(picked) do out[i] = entry(h) end
  return {status = 'ok', history = out}
end

local handlers = {
  execute_request = {'execute_reply', kernel.execute},
  complete_request = {'complete_reply', kernel.complete},
  inspect_request = {'inspect_reply', kernel.inspect},
  is_complete_request = {'is_complete_reply', kernel.is_complete},
  kernel_info_request = {'kernel_info_reply', kernel.kernel_info},
  comm_info_request = {'comm_info_reply', kernel.comm_info},
  history_request = {'history_reply', kernel.history},
}

-- The content fields the handlers read, and their types. A request with a
-- field of another type is malformed: answered with an error, not run. A
-- null counts as absent. (The host checks the fields it reads itself:
-- execute_request's stop_on_error, shutdown_request's restart.)
local fields = {
  execute_request = {{'code', 'string'}, {'silent', 'boolean'}, {'store_history', 'boolean'},
    {'allow_stdin', 'boolean'}, {'user_expressions', 'expressions'}},
  complete_request = {{'code', 'string'}, {'cursor_pos', 'count'}},
  inspect_request = {{'code', 'string'}, {'cursor_pos', 'count'}, {'detail_level', 'count'}},
  is_complete_request = {{'code', 'string'}},
  history_request = {{'hist_access_type', 'string'}, {'n', 'count'}, {'start', 'integer'}, {'stop', 'integer'},
    {'pattern', 'string'}, {'unique', 'boolean'}, {'output', 'boolean'}, {'raw', 'boolean'}},
}

local kinds = {
  string = {'a string', function(v) return type(v) == 'string' end},
  boolean = {'a boolean', function(v) return type(v) == 'boolean' end},
  integer = {'an integer', function(v) return type(v) == 'number' and v == math.floor(v) and v - v == 0 end},
  count = {'an integer >= 0', function(v) return type(v) == 'number' and v == math.floor(v) and v >= 0 and v - v == 0 end},
  expressions = {'an object of strings (name = Lua expression)', function(v)
    if type(v) ~= 'table' then return false end
    for k, e in pairs(v) do
      if type(k) ~= 'string' or type(e) ~= 'string' then return false end
    end
    return true
  end},
}

-- 'a string ("yes")': a decoded JSON value's type and, shortened, the value.
local function described(v)
  local text = json.encode(v)
  if #text > 40 then text = text:sub(1, 37) .. '...' end
  local name = ({string = 'a string', number = 'a number', boolean = 'a boolean'})[type(v)] or 'an array or object'
  return ('%s (%s)'):format(name, text)
end

-- Why content cannot be handled as a msg_type (nil when it can); nulls removed.
local function malformed(msg_type, content)
  for _, f in ipairs(fields[msg_type] or {}) do
    local name, kind = f[1], kinds[f[2]]
    local v = content[name]
    if v == json.null then
      content[name] = nil
    elseif v ~= nil and not kind[2](v) then
      return ('%s: content.%s must be %s, not %s'):format(msg_type, name, kind[1], described(v))
    end
  end
end

-- kernel.handle(msg_type, content_json, send_fn, input_fn) -> reply type,
-- reply content JSON (nil for a request it does not know). Called by the host
-- for each shell request; send_fn(msg_type, content_json) publishes on iopub,
-- input_fn(prompt, password) asks the client for a line on stdin. A request
-- whose fields are of the wrong types gets an error reply (ename
-- MalformedMessage) and is logged to stderr.
function kernel.handle(msg_type, content_json, send_fn, input_fn)
  local h = handlers[msg_type]
  if not h then return nil end
  send = function(t, c) send_fn(t, json.encode(c)) end
  input = input_fn
  local content = json.decode(content_json)  -- the host parsed it as an object
  local problem = malformed(msg_type, content)
  if problem then
    io.stderr:write('anatomy --kernel: shell: ', problem, '\n')
    local reply = {status = 'error', ename = 'MalformedMessage', evalue = problem, traceback = {problem}}
    if msg_type == 'execute_request' then reply.execution_count = count end
    return h[1], json.encode(reply)
  end
  local reply = h[2](content)
  return h[1], json.encode(reply)
end

-- In the kernel, display is a global (as in IPython).
function kernel.install()
  _G.display = kernel.display
end

return kernel
