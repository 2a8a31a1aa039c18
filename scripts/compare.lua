-- Puts several autopsies side by side, from their JSON files (a:json):
--   anatomy scripts/compare.lua A.json B.json [...] [--out=compare.html] [--labels=a,b,...]
-- Prints one table a measure (a column a run, cells more than 10% from the
-- first run's marked *) and writes one HTML report: each run's provenance,
-- the loss curves and the depth profiles overlaid, the tables highlighted.
local files, out, labels = {}, 'compare.html', nil
for _, a in ipairs(arg) do
  local key, value = a:match('^%-%-([%w_]+)=(.*)$')
  if key == 'out' then out = value
  elseif key == 'labels' then
    labels = {}
    for l in value:gmatch('[^,]+') do labels[#labels + 1] = l end
  elseif key or a:match('^%-') then
    io.stderr:write(("compare.lua: unknown option '%s' (expected --out=FILE, --labels=a,b)\n"):format(a))
    os.exit(2)
  else files[#files + 1] = a end
end
if #files < 2 then
  io.stderr:write('usage: anatomy scripts/compare.lua A.json B.json [...] [--out=compare.html] [--labels=a,b,...]\n')
  os.exit(2)
end
local c = autopsy.compare(files, {labels = labels})
print(c)
print('report: ' .. c:report(out))
