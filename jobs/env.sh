# Environment for running kvgrid under Open MPI on a workstation or CI box. Source it:
#   . jobs/env.sh
# The Python jobs and tests read this file too (jobs/mpi_env.py): keep to `export NAME=VALUE`
# lines. (jobs/run.sh sources it under Slurm as well, so it picks no transport; the Python jobs,
# which start their mpirun on this machine, default to shared memory only.)
# Root containers need the two ALLOW_RUN_AS_ROOT variables; more ranks than cores need
# oversubscription; a blocked rank yields its core (DESIGN §2 "Waiting"); traces stay readable
# while written (DESIGN §6).
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export HDF5_USE_FILE_LOCKING=FALSE
# A failing rank's job ends at once: mpirun's default second between its SIGTERM and SIGKILL to the
# other ranks buys nothing here (kvgrid flushes its trace before it aborts and has no SIGTERM
# handler) and cost 1-2 s of every failing run: most of an exploration's or a mutant's time.
export OMPI_MCA_odls_base_sigkill_timeout=0

# hwloc's GL, OpenCL, PCI and libxml plugins and its Linux I/O discovery (every PCI device's config
# space read through sysfs): Open MPI's topology discovery on one workstation needs none of them, and
# they cost every rank (and mpirun) tens of milliseconds — the plugins about 0.05 s of a small 4- or
# 8-rank run here, the I/O discovery another 0.07 s of a small 8-rank run (0.28 s against 0.35 s).
# On a cluster node with several NICs or GPUs, where Open MPI picks them by PCI locality, unset both.
export HWLOC_PLUGINS_BLACKLIST=hwloc_gl,hwloc_opencl,hwloc_pci,hwloc_xml_libxml
export HWLOC_COMPONENTS=-gl,-opencl,-pci,-linuxio
