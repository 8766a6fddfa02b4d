"""The `kubedgx` command (main.py): the user's verbs (validate, render, crds, manifests, instances,
`run --local` in local.py) and the daemon's (operator, check-install in installcheck.py).
"""
