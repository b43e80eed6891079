"""Operating a cluster: Prometheus metrics, gRPC health and reflection, the status page and
`data-server status`, and logs with the ids an operator searches for."""
