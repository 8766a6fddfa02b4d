"""Trainer config edits take effect (issue 13.7): the trainer ConfigMap is named by the job's uid
and the config's content, so resumed workers mount the edited config, a same-named job never
mounts a leftover, and a superseded ConfigMap goes once no worker mounts it.

On the real control plane: tests/cluster/test_operator.py (test_a_trainer_edit_while_suspended...).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dgx_operator.reconcile.planner import plan
from dgx_operator.render import JobIdentity, trainer_config
from dgx_operator.render.names import CONFIG_LABEL
from tests.unit.planner_sim import OLD_UID, Sim, created_pods, make_job, observe, respec, sim_of, start_running


def config_name(sim: Sim) -> str:
    config = trainer_config(JobIdentity.of(sim.job), sim.job.spec)
    assert config is not None
    return config[0]


def mounted(pod: dict[str, Any]) -> str:
    (name,) = [v["configMap"]["name"] for v in pod["spec"]["volumes"] if v["name"] == "trainer-config"]
    return str(name)


def test_the_config_map_is_named_by_uid_and_content(ctx: Any) -> None:
    job = make_job()
    same = trainer_config(JobIdentity.of(job), job.spec)
    again = trainer_config(JobIdentity.of(make_job()), make_job().spec)
    assert same is not None
    assert again is not None
    assert same[0] == again[0]  # deterministic: found again after a restart of the operator
    edited = respec(job, {"spec.trainer.training.learningRate": 0.5})
    other = trainer_config(JobIdentity.of(edited), edited.spec)
    assert other is not None
    assert other[0] != same[0]
    # A job of the same name created again (another uid) never mounts what the deleted one left.
    reborn = make_job({"metadata.uid": OLD_UID})
    third = trainer_config(JobIdentity.of(reborn), reborn.spec)
    assert third is not None
    assert third[0] != same[0]


def test_workers_mount_the_config_map_created_with_them_and_are_labelled_with_it(ctx: Any) -> None:
    sim = sim_of(ctx)
    first = sim.reconcile(at_s=0, shared=False)
    config_maps = [c for c in first.create if c["kind"] == "ConfigMap"]
    assert [c["metadata"]["name"] for c in config_maps] == [config_name(sim)]
    for pod in created_pods(first):
        assert mounted(pod) == config_name(sim)
        assert pod["metadata"]["labels"][CONFIG_LABEL] == config_name(sim).rsplit("-", 1)[1]


def test_an_edit_while_suspended_reaches_the_resumed_workers_and_the_old_config_goes(ctx: Any) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 2}})
    running = start_running(sim, 2)
    before = config_name(sim)
    sim.respec({"spec.suspend": True})
    sim.reconcile(running, at_s=100)
    assert sim.phase() == "Suspended"
    sim.respec({"spec.suspend": False, "spec.trainer.training.learningRate": 0.5})
    after = config_name(sim)
    assert after != before
    # Resumed: the old ConfigMap exists, the new one does not yet.
    observed = dataclasses.replace(observe([]), config_map=False, stale_config_maps=(before,))
    resumed = plan(sim.job, sim.ctx, observed, sim.now)
    made = [c for c in resumed.create if c["kind"] == "ConfigMap"]
    assert [c["metadata"]["name"] for c in made] == [after]
    assert "learningRate: 0.5" in made[0]["data"]["trainer.yaml"]
    assert {mounted(p) for p in created_pods(resumed)} == {after}
    assert resumed.delete_config_maps == [before]  # no worker mounts it any more


def test_a_config_map_a_worker_still_mounts_is_kept(ctx: Any) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 1, "maxNodes": 1}})
    running = start_running(sim, 1)
    stale = config_name(sim)
    edited = respec(sim.job, {"spec.trainer.training.learningRate": 0.5}, bump=True)
    observed = dataclasses.replace(observe(running), config_map=False, stale_config_maps=(stale,))
    result = plan(edited, sim.ctx, observed, sim.now)
    assert result.delete_config_maps == []  # worker 0 mounts it


def test_workers_made_before_configs_were_named_by_content_keep_every_config_map(ctx: Any) -> None:
    sim = sim_of(ctx, {"spec.elastic": {"minNodes": 1, "maxNodes": 1}})
    running = start_running(sim, 1)
    del running[0]["metadata"]["labels"][CONFIG_LABEL]  # an older operator's worker
    observed = dataclasses.replace(observe(running), config_map=False, stale_config_maps=("job-trainer",))
    result = plan(sim.job, sim.ctx, observed, sim.now)
    assert result.delete_config_maps == []
    assert [c["metadata"]["name"] for c in result.create if c["kind"] == "ConfigMap"] == [config_name(sim)]
