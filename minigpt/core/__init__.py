"""What every stage shares: the params schema and its composition from conf/, where artifacts live, atomic
writes, the one-line errors, the stage entry point, each process's share of the cores, and which files define a
run."""
