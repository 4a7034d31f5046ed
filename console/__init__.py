"""What every MANTA command line shares: click conventions (one-line errors and exit codes, the
``--identity`` option) and logging set-up. No torch, no hivemind, so ``--help`` stays fast."""
