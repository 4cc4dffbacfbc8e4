"""Storage: the step table (lane-major ring, side store, bookkeeping), its writers and
the array backends (numpy, memmap, torch) the arrays live in."""
