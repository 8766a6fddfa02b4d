"""The Python client of kubedgx's user verbs (issue 33): jobs on a cluster, their logs and progress,
and the pictures of a run's progress history (plot.py). Never imports the daemon (runtime/,
controllers/, webhook/), kopf, aiohttp or torch.
"""
