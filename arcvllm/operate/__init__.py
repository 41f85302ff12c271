"""The operator's host: settings files, preflight (doctor), which GPUs a server gets,
replicas behind the router (scale), and the field report. Runs where `docker compose`
runs, next to the checkout.
"""
