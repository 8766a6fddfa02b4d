-- Argo CD health check for kubedgx.io/DGXDataMount
-- (argocd-cm key resource.customizations.health.kubedgx.io_DGXDataMount; see docs/argocd.md). Its cases are
-- health_test.yaml beside it, in Argo CD's format, run in Argo CD's own Lua VM by tests/argocd/luavm.
--
--   no status yet                                 Progressing  "waiting for the operator"
--   Ready or Failed of an older spec generation   Progressing  "the spec changed; waiting for the operator ..."
--   Ready                                         Healthy      the Ready condition's message
--   Failed                                        Degraded     the Ready condition's message (why it failed)
--   Pending, Syncing                              Progressing  "<phase>: <the Ready condition's message>"
--
-- Only Lua 5.1's base library and table are used: Argo CD runs health checks in gopher-lua without
-- the string library unless resource.customizations.useOpenLibs is set.

local function ready_message(status)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == "Ready" and c.message ~= nil and c.message ~= "" then
      return c.message
    end
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

local phase = status.phase
local message = ready_message(status)

-- Ready and Failed record the generation they describe; one that is older is being listed again
-- (the operator's jobs read it as Syncing too).
local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
if (phase == "Ready" or phase == "Failed") and generation ~= nil
    and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "the spec changed; waiting for the operator to list generation " .. generation
  return hs
end

if phase == "Ready" then
  hs.status = "Healthy"
  hs.message = message or "Ready"
  return hs
end

if phase == "Failed" then
  hs.status = "Degraded"
  hs.message = message or "the mount failed"
  return hs
end

hs.status = "Progressing"
if message ~= nil then
  hs.message = phase .. ": " .. message
else
  hs.message = phase
end
return hs
