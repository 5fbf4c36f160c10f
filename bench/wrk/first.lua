-- Every request a new task name: first executions.
-- tid is a global each wrk thread gets from setup(): a top-level `local` would give every
-- thread the same sequence of names, and half the "first executions" would be duplicates.
-- nonce (the first script argument) keeps names distinct across runs against the same
-- server; a second argument, when given, is sent as the OIDC ID token (Authorization: Bearer).
local threads = 0
setup = function(thread) thread:set("tid", threads); threads = threads + 1 end
init = function(args) nonce = args[1] or "0"; token = args[2] end
local counter = 0
request = function()
  counter = counter + 1
  local h = {}
  h["Content-Type"] = "application/json"
  h["X-CloudTasks-QueueName"] = "bench"
  h["X-CloudTasks-TaskName"] = "t-" .. nonce .. "-" .. tid .. "-" .. counter
  h["X-CloudTasks-TaskRetryCount"] = "0"
  h["X-CloudTasks-TaskExecutionCount"] = "0"
  h["X-CloudTasks-TaskETA"] = "1792152000.5"
  if token then h["Authorization"] = "Bearer " .. token end
  return wrk.format("POST", "/tasks/noop", h, '{"order_id": 42}')
end
