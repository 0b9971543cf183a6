#include "launcher/stacks.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cxxabi.h>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace ddprun {

namespace {

std::string basename_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// `  File "/x/job.py", line 12 in step` (faulthandler's frame line); false for any other.
bool parse_frame(const std::string& line, Frame& f) {
  static constexpr std::string_view kFile = "  File \"";
  if (!line.starts_with(kFile)) return false;
  const size_t q = line.rfind("\", line ");
  if (q == std::string::npos || q < kFile.size()) return false;
  f.file = line.substr(kFile.size(), q - kFile.size());
  const size_t num = q + 8;
  const size_t in = line.find(" in ", num);
  if (in == std::string::npos) return false;
  f.line = 0;
  std::from_chars(line.data() + num, line.data() + in, f.line);  // "???" stays 0
  f.func = line.substr(in + 4);
  return true;
}

constexpr std::string_view kNativeHeader = "Native thread ";

// "ddp::ProcessGroup::all_reduce" from a mangled name; the name itself when it is not one.
std::string demangled(const std::string& name) {
  int status = -1;
  char* d = abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  std::free(d);
  if (auto paren = out.find('('); paren != std::string::npos && paren > 0) out.erase(paren);  // no parameters
  return out;
}

// glibc's "path(symbol+0x1f)[0x7f..]": "  function (library)"; "" for any other line.
std::string native_frame(const std::string& line) {
  const size_t open = line.find('('), close = line.find(')', open == std::string::npos ? 0 : open);
  if (open == std::string::npos || close == std::string::npos || line.find('[', close) == std::string::npos)
    return "";
  std::string sym = line.substr(open + 1, close - open - 1);
  sym = sym.substr(0, sym.find('+'));
  return fmt::format("  {} ({})", sym.empty() ? "??" : demangled(sym), basename_of(line.substr(0, open)));
}

// readable_native's frame line: "  function (library)".
bool parse_native_frame(const std::string& line, Frame& f) {
  if (!line.starts_with("  ") || line.size() < 4 || line.back() != ')') return false;
  const size_t open = line.rfind(" (");
  if (open == std::string::npos || open < 2) return false;
  f.func = line.substr(2, open - 2);
  f.file = line.substr(open + 2, line.size() - open - 3);
  f.line = 0;
  return true;
}

}  // namespace

std::string readable_native(const std::string& text) {
  if (text.find(kNativeHeader) == std::string::npos) return text;
  std::string out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::string frame = line.starts_with(kNativeHeader) ? "" : native_frame(line);
    out += (frame.empty() ? line : frame) + "\n";
  }
  return out;
}

std::vector<ThreadStack> parse_faulthandler(const std::string& text) {
  std::vector<ThreadStack> threads;
  bool native = false;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const bool current = line.starts_with("Current thread ") || line.starts_with(kNativeHeader);
    if (current || line.starts_with("Thread ") || line.starts_with("Stack (most recent call first)")) {
      threads.push_back(ThreadStack{line, {}, current});
      native = line.starts_with(kNativeHeader);
      continue;
    }
    if (line == "  ..." && !threads.empty()) threads.back().cut = true;
    Frame f;
    if (threads.empty() || !(native ? parse_native_frame(line, f) : parse_frame(line, f))) continue;
    // --preload's warm process (docs/preload.md) lies under every forked worker's script:
    // ddprun's machinery, not where the rank is.
    if (!native && f.file.ends_with("/ddprun_preload.py")) continue;
    // So is the import system's own frames (`<frozen importlib._bootstrap>`, five or more
    // between an `import` and the imported module's code): what shows where an importing
    // rank is are the modules' lines.
    if (!native && f.file.starts_with("<frozen importlib.")) continue;
    threads.back().frames.push_back(std::move(f));
  }
  return threads;
}

std::string fatal_signal_name(int sig) {
  switch (sig) {  // (faulthandler.c's table)
    case SIGSEGV: return "Segmentation fault";
    case SIGABRT: return "Aborted";
    case SIGBUS: return "Bus error";
    case SIGFPE: return "Floating point exception";
    case SIGILL: return "Illegal instruction";
    default: return "";
  }
}

std::string crash_stack(const std::string& text, const std::string& fatal, const std::string& file, size_t depth) {
  const std::string tag = "Fatal Python error: ";
  const size_t at = text.rfind(tag);
  // (Of another signal: not this death's, an older crash's, as of a child that forked
  // without Python's hooks, with the worker's handler.)
  if (at == std::string::npos || fatal.empty() || text.compare(at + tag.size(), fatal.size(), fatal) != 0) return "";
  const std::string dump = text.substr(at);
  const auto threads = parse_faulthandler(dump);
  // The crashing thread is "Current thread"; a free-threaded Python writes it alone, as "Stack".
  auto crashed = std::find_if(threads.begin(), threads.end(), [](const ThreadStack& t) {
    return t.current || t.header.starts_with("Stack (most recent call first)");
  });
  std::string whose = "Python stack at the crash";
  if (crashed == threads.end() || crashed->frames.empty()) {
    // The main thread, written last; unless faulthandler left threads out ("..."): then the
    // last one shown is not it.
    if (threads.empty() || threads.back().frames.empty() || dump.find("\n...\n") != std::string::npos) return "";
    crashed = threads.end() - 1;
    whose += ": the crashing thread ran no Python; the main thread's";
  }
  std::string out = fmt::format("{} (most recent call first; every thread: {}):", whose, file);
  const auto& frames = crashed->frames;
  size_t i = 0;
  for (size_t lines = 0; i < frames.size() && lines < depth; ++lines) {
    const Frame& f = frames[i];
    size_t same = 1;
    while (i + same < frames.size() && frames[i + same].file == f.file && frames[i + same].line == f.line &&
           frames[i + same].func == f.func)
      ++same;
    out += fmt::format("\n  File \"{}\", line {} in {}", f.file, f.line, f.func);
    ++i;
    if (same > 1 && lines + 1 < depth) {
      out += fmt::format("\n  [Previous line repeated {} more times]", same - 1);
      ++lines;
      i += same - 1;
    }
  }
  if (i < frames.size()) out += fmt::format("\n  ... ({} more frame{})", frames.size() - i, frames.size() - i == 1 ? "" : "s");
  if (crashed->cut) out += "\n  ... (and more: faulthandler writes 100 frames at most)";
  return out;
}

namespace {

std::string frame_text(const Frame& f) {
  return f.line > 0 ? fmt::format("{} ({}:{})", f.func, basename_of(f.file), f.line)
                    : fmt::format("{} ({})", f.func, basename_of(f.file));
}

// Python's own modules and installed packages (a virtualenv's too), not the job's code.
bool library_frame(const Frame& f) {
  return f.file.starts_with("<") || f.file.find("/lib/python") != std::string::npos ||
         f.file.find("-packages/") != std::string::npos;
}

}  // namespace

// The innermost `depth` frames; when all of them are Python's or a package's (a rank that
// waits on a DataLoader: four frames of multiprocessing and selectors), the innermost frame
// of the job's own code after them, so that the line says where in the script it waits.
std::string innermost(const ThreadStack& t, size_t depth) {
  std::string out;
  const size_t shown = std::min(depth, t.frames.size());
  for (size_t i = 0; i < shown; ++i) out += (i ? " <- " : "") + frame_text(t.frames[i]);
  if (shown == t.frames.size()) return out;
  const auto from = t.frames.begin() + static_cast<long>(shown);
  auto own = t.frames.end();
  if (!t.header.starts_with(kNativeHeader) && std::all_of(t.frames.begin(), from, library_frame))
    own = std::find_if(from, t.frames.end(), [](const Frame& f) { return !library_frame(f); });
  if (own == t.frames.end()) return out + " <- ...";
  if (own != from) out += " <- ...";
  out += " <- " + frame_text(*own);
  return own + 1 == t.frames.end() ? out : out + " <- ...";
}

std::string RankStack::signature(size_t depth) const {
  if (!given.empty()) return given;
  switch (kind) {
    case Kind::kNoAnswer: return "no answer";
    case Kind::kNoBootstrap: return "no stack (no ddprun bootstrap or libddp in this worker, or not yet)";
    case Kind::kExited: return "exited before it answered";
    case Kind::kStack:
    case Kind::kIncomplete: break;
  }
  auto threads = parse_faulthandler(text);
  if (threads.empty()) return kind == Kind::kIncomplete ? "(incomplete dump)" : "(empty dump)";
  // faulthandler writes the main thread last; a native dump names it by its id (the pid).
  const std::string main_native = fmt::format("{}{} ", kNativeHeader, pid);
  auto main = std::find_if(threads.begin(), threads.end(),
                           [&](const ThreadStack& t) { return t.header.starts_with(main_native); });
  // faulthandler shows at most 100 threads, newest first, then a "..." line: the main
  // thread, the oldest, is then not among them.
  if (main == threads.end() && (text.starts_with("...\n") || text.find("\n...\n") != std::string::npos))
    return "(main thread not in the dump: faulthandler shows 100 threads at most)";
  const ThreadStack& m = main != threads.end() ? *main : threads.back();
  // In the bootstrap's excepthook: the rank fails on an uncaught exception, whose traceback
  // (not the hook's frame) is what tells where, and that is in its output.
  if (!m.frames.empty() && m.frames[0].func == "excepthook" &&
      m.frames[0].file.ends_with("/ddprun/python/sitecustomize.py"))
    return kFailingOnAnException;
  std::string s = innermost(m, depth);
  return s.empty() ? kNoPythonFrame : s;
}

std::string rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<int>>> group_by_signature(const std::vector<RankStack>& stacks) {
  std::map<std::string, std::vector<int>> by_sig;
  for (const auto& s : stacks) by_sig[s.signature()].push_back(s.rank);
  std::vector<std::pair<std::string, std::vector<int>>> groups(by_sig.begin(), by_sig.end());
  for (auto& g : groups) std::sort(g.second.begin(), g.second.end());
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    if (a.second.size() != b.second.size()) return a.second.size() > b.second.size();
    return a.second.front() < b.second.front();
  });
  return groups;
}

namespace {

// "    rank 2's forked processes: pids 311-312: get (queues.py:103) <- _worker_loop (worker.py:308)"
std::string forked_line(const RankStack& s, const std::string& indent) {
  std::vector<RankStack> by_pid = s.forked;  // grouped as ranks are, by pid
  for (auto& c : by_pid) c.rank = c.pid;
  std::vector<std::string> parts;
  for (const auto& [sig, pids] : group_by_signature(by_pid))
    parts.push_back(fmt::format("{} {}: {}", pids.size() > 1 ? "pids" : "pid", rank_ranges(pids), sig));
  if (s.forked_not_asked > 0)
    parts.push_back(fmt::format("{} more not asked (at most {} a rank are asked)", s.forked_not_asked, kMostForked));
  return fmt::format("{}  rank {}'s forked processes: {}\n", indent, s.rank, fmt::join(parts, "; "));
}

}  // namespace

std::string where_lines(const std::vector<RankStack>& stacks, const std::string& indent) {
  std::string out;
  for (const auto& [sig, ranks] : group_by_signature(stacks)) {
    out += fmt::format("{}{} {}: {}\n", indent, ranks.size() > 1 ? "ranks" : "rank", rank_ranges(ranks), sig);
    for (const auto& s : stacks)
      if ((!s.forked.empty() || s.forked_not_asked > 0) && std::find(ranks.begin(), ranks.end(), s.rank) != ranks.end())
        out += forked_line(s, indent);
  }
  return out;
}

std::vector<int> outliers(const std::vector<RankStack>& stacks) {
  auto groups = group_by_signature(stacks);
  if (groups.empty() || groups.front().second.size() * 2 <= stacks.size()) return {};
  std::vector<int> out;
  for (size_t i = 1; i < groups.size(); ++i) out.insert(out.end(), groups[i].second.begin(), groups[i].second.end());
  std::sort(out.begin(), out.end());
  return out;
}

// No majority (two ranks, say), but some ranks wait in torch.distributed while others, with
// a Python stack, are elsewhere: those are the likely ones the others wait for.
static std::string outside_torch_distributed(const std::vector<RankStack>& stacks) {
  std::vector<int> in, out;
  for (const auto& s : stacks) {
    const std::string sig = s.signature();
    // (DDP's gradient all-reduce runs from autograd's engine: a rank in backward may wait in
    // one with no torch.distributed frame, so it is counted on neither side.)
    if (sig.find("(distributed_c10d.py:") != std::string::npos) in.push_back(s.rank);
    else if (s.kind == RankStack::Kind::kStack && sig != kNoPythonFrame && sig.find("backward") == std::string::npos)
      out.push_back(s.rank);
  }
  if (in.empty() || out.empty()) return "";
  auto ranks = [](const std::vector<int>& r) {
    return fmt::format("{} {} {}", r.size() > 1 ? "ranks" : "rank", rank_ranges(r), r.size() > 1 ? "are" : "is");
  };
  return fmt::format(", but {} not in a torch.distributed call ({})", ranks(out), ranks(in));
}

std::string standing_out(const std::vector<RankStack>& stacks) {
  auto odd = outliers(stacks);
  if (!odd.empty())
    return fmt::format("{} {} not where the others are", odd.size() > 1 ? "ranks" : "rank", rank_ranges(odd));
  if (group_by_signature(stacks).size() == 1) return "every rank is at the same place";
  const std::string hint = outside_torch_distributed(stacks);
  return hint.empty() ? "no rank stands out (no majority)" : "no rank stands out by majority" + hint;
}

namespace {

// The first lines of `text` that fit in `most` bytes, and a line that says what was cut.
std::string cut_to(const std::string& text, size_t most, const std::string& host) {
  if (text.size() <= most) return text;
  size_t end = text.rfind('\n', most);
  end = end == std::string::npos ? 0 : end + 1;
  return text.substr(0, end) +
         fmt::format("(cut here: {} bytes more; the whole dump is in the stacks file on {})\n", text.size() - end, host);
}

}  // namespace

constexpr int kMaxNodeRanks = 1 << 16;

std::string encode_node_stacks(const NodeStacks& n, size_t budget) {
  const size_t share = std::max<size_t>(4096, budget / std::max<size_t>(1, n.ranks.size()));
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : n.ranks)
    ranks.push_back({{"rank", r.rank},
                     {"local_rank", r.local_rank},
                     {"pid", r.pid},
                     {"kind", static_cast<int>(r.kind)},
                     {"signature", r.signature()},
                     {"text", cut_to(r.text, share, n.host)},
                     {"native", cut_to(r.native, share, n.host)}});
  nlohmann::json j{{"node", n.node},
                   {"host", n.host},
                   {"first_rank", n.first_rank},
                   {"nranks", n.nranks},
                   {"ranks", std::move(ranks)}};
  // Stack text is not always UTF-8 (a file name's bytes): replaced, never an exception.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<NodeStacks> decode_node_stacks(const std::string& line) {
  auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  try {
    NodeStacks n;
    n.node = j.at("node").get<int>();
    n.host = j.at("host").get<std::string>();
    n.first_rank = j.at("first_rank").get<int>();
    n.nranks = j.at("nranks").get<int>();
    // A node runs at most a few thousand ranks: a range beyond is no answer (the view
    // walks every rank of it).
    if (n.first_rank < 0 || n.nranks < 0 || n.nranks > kMaxNodeRanks || n.first_rank > (1 << 30)) return std::nullopt;
    for (const auto& r : j.at("ranks")) {
      RankStack s;
      s.rank = r.at("rank").get<int>();
      s.local_rank = r.at("local_rank").get<int>();
      s.pid = r.at("pid").get<pid_t>();
      const int kind = r.at("kind").get<int>();
      if (kind < 0 || kind > static_cast<int>(RankStack::Kind::kExited)) return std::nullopt;
      s.kind = static_cast<RankStack::Kind>(kind);
      s.given = r.at("signature").get<std::string>();
      s.text = r.at("text").get<std::string>();
      s.native = r.at("native").get<std::string>();
      n.ranks.push_back(std::move(s));
    }
    return n;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::string full_dump(const std::vector<RankStack>& stacks, const std::vector<std::string>& prefixes, bool forked) {
  std::string out;
  for (size_t i = 0; i < stacks.size(); ++i) {
    const RankStack& s = stacks[i];
    const std::string& p = i < prefixes.size() ? prefixes[i] : std::string();
    if (s.kind != RankStack::Kind::kStack && s.kind != RankStack::Kind::kIncomplete) {
      out += fmt::format("{}{} (pid {}){}{}\n", p, s.signature(), s.pid, s.native.empty() ? "" : ": ", s.native);
      continue;
    }
    std::istringstream in(s.text);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) out += p + line + "\n";
    if (s.kind == RankStack::Kind::kIncomplete) out += p + "(the dump was still being written at the deadline)\n";
    if (!forked) continue;
    for (const RankStack& c : s.forked) {
      out += fmt::format("{}Process {}, forked by this rank:\n", p, c.pid);
      out += full_dump(std::vector<RankStack>{c}, {p});
    }
  }
  return out;
}

namespace {

std::string byte_count(uint64_t b) {
  if (b >= (uint64_t{1} << 30)) return fmt::format("{:.1f} GiB", static_cast<double>(b) / (1 << 30));
  if (b >= (uint64_t{1} << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20));
  if (b >= (uint64_t{1} << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(b) / (1 << 10));
  return fmt::format("{} B", b);
}

// Where a rank is, without the times (they differ by rank; the place is what groups them).
std::string place(const RankCollective& c) {
  return fmt::format("{} #{} {}", c.op, c.number, c.in_flight ? "in flight" : "done");
}

}  // namespace

std::string collective_lines(const std::vector<RankCollective>& ranks, const std::string& indent) {
  if (ranks.empty()) return "";
  std::vector<std::pair<std::string, std::vector<const RankCollective*>>> groups;
  for (const auto& c : ranks) {
    const std::string p = place(c);
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == p; });
    if (it == groups.end()) groups.push_back({p, {&c}});
    else it->second.push_back(&c);
  }
  std::stable_sort(groups.begin(), groups.end(),
                   [](auto& a, auto& b) { return a.second.size() > b.second.size(); });
  std::string out;
  for (auto& [p, members] : groups) {
    std::vector<int> rs;
    double longest = 0;
    for (auto* m : members) {
      rs.push_back(m->rank);
      longest = std::max(longest, m->seconds);
    }
    const RankCollective& c = *members.front();
    out += fmt::format("{}{} {}: {} #{} {} {:.1f} s{} ({}, {})\n", indent, rs.size() == 1 ? "rank" : "ranks",
                       rank_ranges(rs), c.op, c.number, c.in_flight ? "in flight for" : "done, started",
                       longest, c.in_flight ? "" : " ago", byte_count(c.bytes), c.backend);
  }
  if (groups.size() > 1 && groups.front().second.size() * 2 > ranks.size()) {
    std::vector<int> odd;
    for (size_t g = 1; g < groups.size(); ++g)
      for (auto* m : groups[g].second) odd.push_back(m->rank);
    std::string where = groups.size() == 2 ? " at " + groups[1].first : " elsewhere";
    out += fmt::format("{}{} {} {}{}, the others at {}\n", indent, odd.size() == 1 ? "rank" : "ranks",
                       rank_ranges(odd), odd.size() == 1 ? "is" : "are", where, groups.front().first);
  }
  return out;
}

}  // namespace ddprun
