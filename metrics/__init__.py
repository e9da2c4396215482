"""nvshare-metrics: the agent's state in the Prometheus text format, one scrape per
process under systemd's socket activation (docs/metrics.md)."""
