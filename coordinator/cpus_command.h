// `splitserve cpus`: this host's CPUs as `splitserve up` would share them, for hosts run by the
// systemd units.
#pragma once

namespace ss {

// `splitserve cpus --gpu-workers N [--expert-workers N|auto] [--coordinator yes|no]
// [--write-dropins DIR]`: this host's CPUs as `up` would share them (coord::PlanLaunchCpus), for
// hosts run by the systemd units; with --write-dropins also as the units' drop-ins
// (coord::CpuDropIns). hwloc's HWLOC_XMLFILE / HWLOC_SYNTHETIC give it another host's topology
// (NumaTopology::Discover). Exit 0, 1 when the topology cannot be read or a drop-in written, 2 for
// bad flags.
int RunCpusCommand(int argc, char** argv);

}  // namespace ss
