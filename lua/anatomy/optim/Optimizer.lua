-- The parameter list an optimizer takes: a module's parameters, or a table
-- of tensors that require grad; an error naming the optimizer otherwise.
return function(params, where, level)
  local list = nn.is_module(params) and params:parameters() or params
  if type(list) ~= 'table' then error(('%s: expected a module or a table of parameters, got %s'):format(where, nn.typename(params)), level + 1) end
  for i, p in ipairs(list) do
    if not torch.is_tensor(p) or not p.requires_grad then
      error(('%s: parameter %d is not a tensor that requires grad'):format(where, i), level + 1)
    end
  end
  if #list == 0 then error(('%s: no parameters to optimize'):format(where), level + 1) end
  return list
end
