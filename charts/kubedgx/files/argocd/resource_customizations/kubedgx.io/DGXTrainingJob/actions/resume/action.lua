-- Argo CD resource action "resume" of kubedgx.io/DGXTrainingJob: spec.suspend = false. The operator creates
-- workers again (a job queued with Kueue first waits for its Workload to be admitted again); they resume from the
-- job's checkpoint. Under automated sync with self-heal, see suspend/action.lua.
if obj.spec == nil then
  obj.spec = {}
end
obj.spec.suspend = false
return obj
