"""RPC plumbing shared by the servers and the clients: addresses, channels, servers,
errors and their status codes, retried calls, and the one client of the dispatcher."""
