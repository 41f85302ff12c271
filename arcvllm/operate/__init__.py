"""The operator's host: what the host is (host: GPUs, render nodes, the key file, the
effective settings), how compose is run (compose), settings files, preflight (doctor), which
GPUs a server gets, replicas behind the router (scale), and the field report. Runs where
`docker compose` runs, next to the checkout.
"""
