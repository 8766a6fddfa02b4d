-- Argo CD health check for kubedgx.io/DGXTrainingJob
-- (argocd-cm key resource.customizations.health.kubedgx.io_DGXTrainingJob; see docs/argocd.md). Its cases are
-- health_test.yaml beside it, in Argo CD's format, run in Argo CD's own Lua VM by tests/argocd/luavm.
--
--   no status yet, or a status of an older generation   Progressing  "waiting for the operator ..."
--   Succeeded                                            Healthy      the Succeeded condition's message
--   Failed                                               Degraded     the Failed condition's message
--   Suspended                                            Suspended    the Suspended condition's message
--   Pending, WaitingForData, Running, Restarting         Progressing  "<phase>: <the condition that explains it>"
--
-- Only Lua 5.1's base library and table are used: Argo CD runs health checks in gopher-lua without
-- the string library unless resource.customizations.useOpenLibs is set.

local function find_condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function message_of(status, kind)
  local c = find_condition(status, kind)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return nil
end

local hs = {}
local status = obj.status
if status == nil or status.phase == nil or status.phase == "" then
  hs.status = "Progressing"
  hs.message = "waiting for the operator"
  return hs
end

local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to observe generation " .. generation
  if status.observedGeneration ~= nil then
    hs.message = hs.message .. " (the status describes generation " .. status.observedGeneration .. ")"
  end
  return hs
end

local phase = status.phase

if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = message_of(status, "Succeeded") or "training completed"
  -- A final model the job was asked to archive and did not is worth seeing, though the job succeeded.
  local archived = find_condition(status, "Archived")
  if archived ~= nil and archived.status == "False" and archived.message ~= nil and archived.message ~= "" then
    hs.message = hs.message .. "; " .. archived.message
  end
  return hs
end

if phase == "Failed" then
  hs.status = "Degraded"
  hs.message = message_of(status, "Failed") or "the job failed"
  return hs
end

if phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = message_of(status, "Suspended") or "spec.suspend is true"
  return hs
end

-- Pending, WaitingForData, Running, Restarting (and any phase a newer operator adds): still going.
local message = nil
if phase == "WaitingForData" then
  message = message_of(status, "DataReady")
elseif phase == "Restarting" then
  message = message_of(status, "Restarting")
end
message = message or message_of(status, "Running")

hs.status = "Progressing"
if message ~= nil then
  hs.message = phase .. ": " .. message
else
  hs.message = phase
end
if phase == "Running" and status.progress ~= nil and status.progress.step ~= nil then
  local step = "step " .. status.progress.step
  if status.progress.totalSteps ~= nil then
    step = step .. "/" .. status.progress.totalSteps
  end
  hs.message = hs.message .. " (" .. step .. ")"
end
return hs
