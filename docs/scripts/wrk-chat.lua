counter = 0
request = function()
  counter = counter + 1
  local body = '{"model":"llama-3.1-8b","max_tokens":1,"messages":[{"role":"system","content":"' .. string.rep("You are a helpful assistant. ", 40) .. '"},{"role":"user","content":"question ' .. counter .. '"}]}'
  return wrk.format("POST", "/v1/chat/completions", {["Content-Type"]="application/json"}, body)
end
