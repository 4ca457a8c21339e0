"""The control listener: /metrics, the /gate/v1/ API."""
