-- Walking a trace step's values: the one order (position, then entry) that
-- the register, the printing and the float check all read them in.
local walk = {}

-- walk.each_value(step, fn): fn(v, pos, i) for each entry of a step of
-- vectors or rows, fn(v, pos) for each of a step of scalars; tokens and
-- argmax steps hold no values.
function walk.each_value(s, fn)
  if s.kind == 'vectors' or s.kind == 'rows' then
    for pos, vec in ipairs(s.values) do
      for i, v in ipairs(vec) do fn(v, pos, i) end
    end
  elseif s.kind == 'scalars' then
    for pos, v in ipairs(s.values) do fn(v, pos) end
  end
end

-- walk.values(step) -> the step's values as one list, in that order.
function walk.values(s)
  local list = {}
  walk.each_value(s, function(v) list[#list + 1] = v end)
  return list
end

return walk
