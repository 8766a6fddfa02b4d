-- Argo CD resource action "suspend" of kubedgx.io/DGXTrainingJob: spec.suspend = true. The operator deletes the
-- workers and keeps the job (Suspended, reason Suspended); a job queued with Kueue also has its Workload
-- deactivated, so its quota returns. Argo CD sends the change as a merge patch of the live object: under automated
-- sync with self-heal, ignore /spec/suspend in the Application or the next sync undoes it (docs/argocd.md).
if obj.spec == nil then
  obj.spec = {}
end
obj.spec.suspend = true
return obj
