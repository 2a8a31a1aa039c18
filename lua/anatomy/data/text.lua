-- text: measures of text itself, for judging what a model generates.
local native = require('anatomy.torch.native')
local text = {}

-- text.compressed_size(s) -> bytes of s after zlib compression (level 9)
function text.compressed_size(s)
  assert(type(s) == 'string', 'text.compressed_size expects a string')
  return native.compressed_size(s, 9)
end

-- text.compression_ratio(s) -> compressed size / size: lower means more repetitive text
function text.compression_ratio(s)
  if #s == 0 then return 0 end
  return text.compressed_size(s) / #s
end

return text
