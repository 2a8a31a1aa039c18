-- The outputs every result shares (an autopsy, a comparison, a series, a
-- sweep, a patching grid, an edge graph): a result type describes itself
-- with a few methods and result.outputs adds the rest, the same for all.
--   __tostring        the text print shows
--   data()            plain data                -> json(path)
--   html(...)         a whole page (page.new)   -> report(path, ...), and in
--                                                  a notebook that page
--   svg()             a chart (a <figure>)      -> what a notebook shows, and
--                                                  what a:add draws in a report
-- Files are written atomically, their folder made first; a path that is no
-- path is an error at the caller's line naming the method ('c:json').
local fs = require('anatomy.io.fs')
local json = require('anatomy.io.json')
local result = {}

-- result.write(path, text, where) -> path: text written atomically to path,
-- its folder made first; a bad path is an error two levels up (the caller of
-- the method that called write)
function result.write(path, text, where)
  if type(path) ~= 'string' or path == '' then error(('%s: path must be a file path, got %s'):format(where, type(path)), 3) end
  fs.mkdir(fs.dirname(path))
  return fs.write_atomic(path, text)
end

-- result.outputs(Class, short) -> Class, with json(path) where it has data(),
-- report(path, ...) and _repr_mimebundle() where it has html(...). short:
-- how errors name an instance ('a' for a:json). Call it after the methods
-- it reads are defined.
function result.outputs(Class, short)
  if Class.data then
    -- r:json(path) -> path: the result's data() as JSON, written atomically (its folder made first)
    Class.json = function(self, path)
      local written = result.write(path, json.encode(self:data()) .. '\n', short .. ':json')
      return written
    end
  end
  if Class.html then
    -- r:report(path, ...) -> path: the result's self-contained page, html(...), written atomically (its folder made first)
    Class.report = function(self, path, ...)
      local written = result.write(path, self:html(...), short .. ':report')
      return written
    end
    -- In a notebook: the page (the kernel scopes its style to it) and the text print shows.
    Class._repr_mimebundle = function(self)
      return {['text/html'] = self:html(), ['text/plain'] = tostring(self)}
    end
  end
  return Class
end

return result
