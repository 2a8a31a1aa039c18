-- A SentencePiece BPE model file written byte by byte, for the tests and the
-- fuzz seeds (protocol buffers: ModelProto.pieces = 1 {piece = 1, score = 2,
-- type = 3}, trainer_spec = 2 {model_type = 3}).
local M = {}

M.varint = require('anatomy.io.export').varint  -- the TensorBoard writer's protocol-buffer varint
function M.field(number, bytes) return M.varint(number * 8 + 2) .. M.varint(#bytes) .. bytes end
M.SP = '\226\150\129'  -- U+2581
-- 0-based ids: 0 <unk>, 1 <s>, 2 </s>, 3 <0xC3>, 4 <0xA9>, 5 ▁, 6 h, 7 e, 8 l, 9 o, 10 ▁h, 11 ll, 12 he,
-- 13 ▁he, 14 llo, 15 ▁hello, 16 <|user|>. Merges, by the merged piece's id then the left part's length:
-- ▁ h (0), l l (1), h e (2), ▁ he (3), ▁h e (4), ll o (5), ▁he llo (6).
M.PIECES = {{'<unk>', 2}, {'<s>', 3}, {'</s>', 3}, {'<0xC3>', 6}, {'<0xA9>', 6}, {M.SP, 1}, {'h', 1}, {'e', 1}, {'l', 1},
  {'o', 1}, {M.SP .. 'h', 1}, {'ll', 1}, {'he', 1}, {M.SP .. 'he', 1}, {'llo', 1}, {M.SP .. 'hello', 1}, {'<|user|>', 4}}
-- M.bytes(model_type = 2 (BPE; 1 is UNIGRAM), pieces = M.PIECES) -> the file's bytes
function M.bytes(model_type, pieces)
  local out = {}
  for _, p in ipairs(pieces or M.PIECES) do out[#out + 1] = M.field(1, M.field(1, p[1]) .. M.varint(3 * 8) .. M.varint(p[2])) end
  out[#out + 1] = M.field(2, M.varint(3 * 8) .. M.varint(model_type or 2))
  return table.concat(out)
end

return M
