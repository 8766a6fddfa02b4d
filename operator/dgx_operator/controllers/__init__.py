"""The two controllers, side by side: the DGXTrainingJob's (job.py) and the DGXDataMount's
(mount.py), each a thin loop that reads the cluster, asks reconcile/ what to do and writes it, with
the reconcile loop they share (loop.py) and the operator's metrics (metrics.py). Neither imports
the other (an import contract).
"""
