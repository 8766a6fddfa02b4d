"""The daemon: its settings (settings.py, each declared once), the kopf wiring of the controllers
(handlers.py) and of the webhook (webhooks.py), leader election, the PriorityClasses check and the
process around them (daemon.py: health and metrics servers, signals).
"""
