"""After training: full-split scoring of a checkpoint (static and dynamic), the classical baselines, samples
(the generate stage) and the checkpoint doctor."""
