"""What each ``tierfs`` subcommand does, by job: the store commands (``store_commands``,
the ``COMMANDS`` table ``execution`` runs), the daemon and mount, defrag, gc, lost+found,
metadata export/import and restore, and tier-2 ownership. The grammar is ``cli/parser``;
nothing here is imported to print help."""
