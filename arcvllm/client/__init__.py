"""Talking to a running OpenAI-compatible vLLM server: the HTTP client, its Prometheus
metrics, what its log says, and the statistics of what was measured. Used by smoke, bench,
scale and the field report, from any host that reaches the server.
"""
