"""What a manifest must be before the operator takes it, checked without a cluster: the validator
(validator.py: the CRD schemas with their CEL rules, the catalog, the trainer config and the
official Kubernetes schemas of other kinds) and the metadata rules it shares with the webhook
(objectmeta.py). `kubedgx validate` and the admission webhook both run it.
"""
