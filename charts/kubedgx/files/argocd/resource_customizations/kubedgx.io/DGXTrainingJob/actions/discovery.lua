-- Argo CD resource actions of kubedgx.io/DGXTrainingJob: which to offer
-- (argocd-cm key resource.customizations.actions.kubedgx.io_DGXTrainingJob; see docs/argocd.md).
--
--   spec.suspend true                              resume   (whatever the status says: it may lag the spec)
--   not suspended, not finished                    suspend  (a job Kueue holds too: it gives back its quota)
--   finished (Succeeded or Failed, or Finished)    nothing  (workers are gone; suspending changes nothing)
--
-- spec.suspend is the user's field and the only one these actions write. A job that only Kueue holds is
-- Suspended too, with Kueue's reason on its Suspended condition (Pending, Inadmissible, Preempted, Deactivated,
-- ...), but its spec.suspend is not set: resume is not offered, as there is nothing of the user's to lift
-- (docs/kueue.md, "Why a job is Suspended"). A newer operator's Finished condition is honoured when present;
-- the phase alone decides otherwise.
--
-- Only Lua 5.1's base library and table are used: Argo CD runs actions without the open libraries.

local actions = {}

if obj.spec ~= nil and obj.spec.suspend == true then
  actions["resume"] = {["iconClass"] = "fa fa-fw fa-play"}
  return actions
end

local finished = false
local status = obj.status
if status ~= nil then
  if status.phase == "Succeeded" or status.phase == "Failed" then
    finished = true
  end
  if status.conditions ~= nil then
    for _, c in ipairs(status.conditions) do
      if c.type == "Finished" and c.status == "True" then
        finished = true
      end
    end
  end
end

if not finished then
  actions["suspend"] = {["iconClass"] = "fa fa-fw fa-pause"}
end
return actions
