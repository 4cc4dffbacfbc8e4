"""Writers of the step table: the reference write, the lean one-lane writer, the compiled
writer and the plan that chooses among them once per table."""
