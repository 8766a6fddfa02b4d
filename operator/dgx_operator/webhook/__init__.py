"""The validating admission webhook: what it answers (admission.py: the validator's checks plus what
needs the cluster) and how it gets TLS (certificates.py, config.py).
"""
