-- The same task name every time, marked as a retry as Cloud Tasks marks one: duplicates.
-- The second script argument, when given, is sent as the OIDC ID token (the first, a nonce,
-- is first.lua's).
init = function(args) token = args[2] end
request = function()
  local h = {}
  h["Content-Type"] = "application/json"
  h["X-CloudTasks-QueueName"] = "bench"
  h["X-CloudTasks-TaskName"] = "same-task"
  h["X-CloudTasks-TaskRetryCount"] = "1"
  h["X-CloudTasks-TaskExecutionCount"] = "1"
  h["X-CloudTasks-TaskETA"] = "1792152000.5"
  if token then h["Authorization"] = "Bearer " .. token end
  return wrk.format("POST", "/tasks/noop", h, '{"order_id": 42}')
end
