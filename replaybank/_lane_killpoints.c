/* The crash tests' build of the writer, replaybank._lane_killpoints: _lane.c compiled with
 * REPLAYBANK_KILLPOINTS, so that every durable store is counted (see
 * replaybank/storage/writers/killpoint.py). A source of its own gives it an object file of
 * its own: compiled from _lane.c directly, both modules wrote build/.../_lane.o, and a
 * parallel build (build_ext -j) could link one module from the other's object. */
#define REPLAYBANK_KILLPOINTS 1
#include "_lane.c"
