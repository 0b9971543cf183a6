// Slurm: the SLURM_* variables of a job, its host lists, and the job ddprun derives from
// them inside an srun step (docs/slurm.md). Nothing here runs scontrol or needs DNS to
// read a host list.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/options.hpp"

namespace ddprun::slurm {

// Expands a Slurm host list ("n[1-3,07],gpu-a[1-2]-ib") exactly as Slurm 23.02+ does, and
// everything 22.05 accepts: tokens split at commas and blanks outside brackets (empty ones
// skipped), each bracket a list of NUM or LO-HI ranges zero-padded to the width of their
// low bound, text allowed after a bracket, several brackets per token (Slurm's order: the
// last bracket innermost, the others right to left from the outside), duplicates and order
// kept. Throws ddp::UsageError naming `source` (the variable) and the text when malformed.
std::vector<std::string> expand_hostlist(const std::string& text, const std::string& source);

// What this process sees of Slurm.
struct Env {
  std::string job_id;           // SLURM_JOB_ID (or SLURM_JOBID)
  std::optional<long> step_id;  // SLURM_STEP_ID: set inside an srun step only (unset in the batch shell)
  int node_id = 0;              // SLURM_NODEID: this node's index in the step
  bool node_id_set = false;     // SLURM_NODEID was there (srun sets it; a filtering wrapper may not)
  int nnodes = 1;               // nodes of the step (of the job in the batch shell)
  std::string nnodes_var;       // the variable nnodes came from
  int ntasks = 1;               // tasks of the step
  std::string ntasks_var;
  std::string nodelist_var;  // SLURM_STEP_NODELIST, or the job's list outside a step
  std::string nodelist;      // its text (expand() it)
  std::string nodename;      // SLURMD_NODENAME
  // A heterogeneous job's components (SLURM_HET_SIZE): SLURM_JOB_NODELIST_HET_GROUP_<k>
  // (_PACK_GROUP_<k> before Slurm 20.02).
  std::vector<std::pair<std::string, std::string>> het_lists;  // variable, text

  bool in_step() const { return step_id.has_value(); }
  std::string step_name() const;           // "12.0" (Slurm's notation), "12" outside a step
  std::vector<std::string> nodes() const;  // nodelist expanded; throws UsageError if malformed
  // The step's nodes in SLURM_NODEID order: nodes(), except in a heterogeneous step, which
  // numbers its nodes component by component while its node list is sorted. Empty when the
  // components in the step cannot be told. Throws UsageError if a list is malformed.
  std::vector<std::string> nodes_by_id() const;
};

// nullopt outside a Slurm job. Throws ddp::UsageError naming the variable for a malformed
// number.
std::optional<Env> read_env(const std::map<std::string, std::string>& env);

// The store port of a step: 20000 + (job mod 1595) * 8 + (step mod 8), skipping 29400 and
// 29500 (torchrun's defaults, which other jobs on a shared node use), so always within
// 20000..32767: below Linux's ephemeral range (32768-60999 by default), above the
// well-known and registered service ports most daemons use. Every node of a step computes
// the same port with no communication. Two steps get the same port only when their job ids
// are equal modulo 1595 and their step ids modulo 8: jobs whose ids differ by less than
// 1595 never collide, whatever their steps; a job's own steps collide only 8 steps apart.
// A job id that is not a number is hashed.
int derived_port(const std::string& job_id, long step_id);

// Resolves a host name to its addresses (numeric strings); empty when it does not resolve.
using Resolver = std::function<std::vector<std::string>(const std::string&)>;
std::vector<std::string> resolve_host(const std::string& host);

// True when `endpoint` names the Slurm node `node`: the same name (case-insensitive), the
// short and the fully qualified form of one name, or an address that `node` resolves to.
bool same_host(const std::string& endpoint, const std::string& node, const Resolver& resolve);

// Derives what the command line left open from Slurm (called by parse_options before the
// rendezvous checks; o.given says what was explicit). Inside an srun step with one task per
// node and the static rendezvous: node count, node rank (SLURM_NODEID), master address (the
// step's first node, as above), a port from the job and step ids and the run id "<job>.<step>". With
// c10d and an endpoint on the step's first node (SLURM_NODEID 0's: in a heterogeneous step,
// the first node of its first component): rdzv_conf.is_host = (SLURM_NODEID == 0),
// and the node count. One node: a free port, so jobs sharing a node never meet. In the
// batch shell or with several tasks per node: a warning, and nothing multi-node. Adds one
// line to o.infos saying what it derived, warnings to o.warnings; nothing with o.no_slurm.
// Throws ddp::Error when the step's first node does not resolve here.
void apply(Options& o, const std::map<std::string, std::string>& env, const Resolver& resolve = resolve_host);

}  // namespace ddprun::slurm
