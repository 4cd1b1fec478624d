"""Many daemons, one namespace: segment containers owned through leases in PostgreSQL,
and the router that serves the whole namespace from any daemon (docs/ARCHITECTURE.md,
"Many hosts")."""
