#include "launcher/output.hpp"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>
#include <wchar.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <clocale>
#include <cstring>
#include <ctime>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ddp/error.hpp"

namespace ddprun {

namespace {

// 0, or the errno of the write that failed (a closed console, a full disk: the caller says
// so once and goes on without it).
int write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

// The length of the UTF-8 sequence that byte c leads (1 for ASCII, or a byte that leads none).
size_t utf8_length(unsigned char c) {
  return (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
}

// Bytes at the end of [p, p+n) that start a UTF-8 sequence which is not complete yet.
size_t incomplete_utf8_tail(const char* p, size_t n) {
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    auto c = static_cast<unsigned char>(p[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    return utf8_length(c) > back ? back : 0;
  }
  return 0;
}

// A cut at or before max that does not split a UTF-8 character (it may be 0 when max < 4).
size_t utf8_cut(const char* p, size_t max) {
  size_t cut = max;
  while (cut > 0 && cut + 3 > max && (static_cast<unsigned char>(p[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

// A line as a terminal shows its text: its escape sequences (ECMA-48: colours, cursor
// moves; a window title's or a hyperlink's string) taken out. A worker writing to a
// terminal colours its traceback (Python 3.13) or its log; the report wants the words.
void strip_escapes(std::string& s) {
  // (two memchr scans: every line of a tail passes here)
  if (s.find('\x1b') == std::string::npos && s.find('\a') == std::string::npos) return;
  const auto in = [&](size_t j, unsigned char lo, unsigned char hi) {
    return j < s.size() && static_cast<unsigned char>(s[j]) >= lo && static_cast<unsigned char>(s[j]) <= hi;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s[i] == '\a') {  // a bell rings, and shows nothing
      ++i;
      continue;
    }
    if (s[i] != '\x1b') {
      out += s[i++];
      continue;
    }
    size_t j = i + 1;
    if (j < s.size() && std::string_view("]P_^X").find(s[j]) != std::string_view::npos) {
      // A string (OSC, DCS...): up to BEL or ESC '\'.
      while (j < s.size() && s[j] != '\a' && s[j] != '\x1b') ++j;
      i = j + (j < s.size() && s[j] == '\a' ? 1 : j + 1 < s.size() && s[j + 1] == '\\' ? 2 : 0);
      continue;
    }
    if (j < s.size() && s[j] == '[') {  // CSI: parameter and intermediate bytes
      ++j;
      while (in(j, 0x20, 0x3F)) ++j;
    } else {
      while (in(j, 0x20, 0x2F)) ++j;  // intermediate bytes
    }
    i = in(j, 0x30, 0x7E) ? j + 1 : j;  // the final byte
  }
  s = std::move(out);
}

// The columns code point c takes on a terminal: wcwidth() in a UTF-8 locale (two for CJK
// and emoji, none for a combining mark), whatever locale ddprun runs in; one where there
// is no such locale, or c has no width.
int columns_of(char32_t c) {
  static const locale_t utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  if (!utf8) return 1;
  const locale_t was = uselocale(utf8);
  const int w = wcwidth(static_cast<wchar_t>(c));
  uselocale(was);
  return w < 0 ? 1 : w;
}

}  // namespace

size_t terminal_columns(std::string_view text) {
  std::string shown(text);
  strip_escapes(shown);
  size_t columns = 0;
  for (size_t i = 0; i < shown.size();) {
    const auto b = static_cast<unsigned char>(shown[i]);
    size_t len = utf8_length(b);
    char32_t c = len == 1 ? b : b & (0x3F >> (len - 1));
    for (size_t k = 1; k < len; ++k) {
      if (i + k >= shown.size() || (shown[i + k] & 0xC0) != 0x80) {  // not UTF-8: a byte a column
        len = 1;
        c = b;
        break;
      }
      c = (c << 6) | (shown[i + k] & 0x3F);
    }
    if (c >= 0x20 && c != 0x7F) columns += static_cast<size_t>(columns_of(c));  // control characters take none
    i += len;
  }
  return columns;
}

// ---------------------------------------------------------------- ConsoleWriter

ConsoleWriter::ConsoleWriter(int fd, size_t bound, int wake_fd)
    : fd_(fd), bound_(bound), wake_fd_(wake_fd), terminal_(isatty(fd) == 1) {
  // A regular file or /dev/null never blocks a writer: no thread, no hand-off.
  struct stat st {};
  if (fstat(fd, &st) == 0 && (S_ISREG(st.st_mode) || (S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3))))
    direct_ = true;
}

ConsoleWriter::~ConsoleWriter() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// The first failed write says, once, that this console's output is dropped from here on;
// never called with mu_ held (the line may go to this very console). Not for stderr: ddprun's
// own log goes there, so there is nowhere to say it, and the write that failed may be the
// logger's own (its lock held: a line logged from here would wait for it forever).
void ConsoleWriter::lost(int err) {
  if (err == 0 || lost_.exchange(true) || fd_ == 2 || carries_log_) return;
  spdlog::warn("cannot write to {} ({}): the workers' output to it is dropped from here on; the job runs on",
               fd_ == 1 ? "stdout" : fmt::format("fd {}", fd_), ddp::errno_text(err));
}

// The thread starts with the first output: a job whose workers print nothing never pays
// for it. Called with mu_ held.
void ConsoleWriter::start_locked() {
  if (!thread_.joinable() && !stop_) thread_ = std::thread([this] { run(); });
}

void ConsoleWriter::push(std::string&& chunk) {
  if (chunk.empty()) return;
  size_t n = chunk.size();
  if (direct_) {
    int err;
    {
      std::lock_guard lk(mu_);
      at_line_start_ = chunk.back() == '\n';
      err = write_all(fd_, chunk.data(), n);
    }
    lost(err);
    return;
  }
  {
    std::lock_guard lk(mu_);
    if (stop_) return;  // abandoned: dropped
    at_line_start_ = chunk.back() == '\n';
    queue_.push_back(std::move(chunk));
    start_locked();
  }
  size_t total = pending_.fetch_add(n, std::memory_order_relaxed) + n;
  if (total >= bound_) waiting_for_room_.store(true, std::memory_order_relaxed);
  cv_.notify_one();
}

void ConsoleWriter::push_line(std::string&& line) {
  if (line.empty()) return;
  size_t n;
  int err = 0;
  {
    std::lock_guard lk(mu_);
    if (stop_ && !direct_) return;  // abandoned: dropped
    if (!at_line_start_) {
      line.insert(line.begin(), '\n');
      interruptions_.fetch_add(1, std::memory_order_relaxed);
    }
    at_line_start_ = line.back() == '\n';
    n = line.size();
    if (direct_) {
      err = write_all(fd_, line.data(), n);
    } else {
      queue_.push_back(std::move(line));
      start_locked();
    }
  }
  if (direct_) return lost(err);
  pending_.fetch_add(n, std::memory_order_relaxed);
  cv_.notify_one();
}

void ConsoleWriter::flush() {
  std::unique_lock lk(mu_);
  drained_.wait(lk, [&] { return pending_.load() == 0; });
}

bool ConsoleWriter::flush_until(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lk(mu_);
  return drained_.wait_until(lk, deadline, [&] { return pending_.load() == 0; });
}

void ConsoleWriter::abandon() {
  lost_.store(true);  // said already by whoever abandons it
  std::lock_guard lk(mu_);
  stop_ = true;
  queue_.clear();
  if (thread_.joinable()) thread_.detach();
  cv_.notify_all();
}

void ConsoleWriter::run() {
  std::deque<std::string> batch;
  for (;;) {
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty() && stop_) return;
      batch.swap(queue_);
    }
    // One writev for many chunks; chunks hold whole lines, so lines never tear.
    size_t i = 0;
    while (i < batch.size()) {
      iovec iov[64];
      size_t cnt = std::min<size_t>(64, batch.size() - i);
      size_t bytes = 0;
      for (size_t k = 0; k < cnt; ++k) {
        iov[k] = {batch[i + k].data(), batch[i + k].size()};
        bytes += batch[i + k].size();
      }
      // Once the console is gone, its output is dropped without asking the kernel again.
      ssize_t w = lost_.load(std::memory_order_relaxed) ? static_cast<ssize_t>(bytes)
                                                        : ::writev(fd_, iov, static_cast<int>(cnt));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {  // console gone: drop, keep workers moving
        lost(errno);
        w = static_cast<ssize_t>(bytes);
      }
      size_t left = static_cast<size_t>(w), done = 0, k = 0;
      while (k < cnt && left >= batch[i + k].size()) {
        left -= batch[i + k].size();
        done += batch[i + k].size();
        ++k;
      }
      if (k < cnt && left > 0) {  // a chunk written in part: finish it before the next writev
        lost(write_all(fd_, batch[i + k].data() + left, batch[i + k].size() - left));
        done += batch[i + k].size();
        ++k;
      }
      pending_.fetch_sub(done, std::memory_order_relaxed);
      i += k;
    }
    batch.clear();
    size_t now = pending_.load(std::memory_order_relaxed);
    // (Not once abandoned: the loop that owns the eventfd may have closed it.)
    if (waiting_for_room_.load(std::memory_order_relaxed) && now < bound_ / 2 && !lost_.load()) {
      waiting_for_room_.store(false, std::memory_order_relaxed);
      uint64_t one = 1;
      ssize_t r = ::write(wake_fd_, &one, sizeof one);
      (void)r;
    }
    if (now == 0) {
      std::lock_guard lk(mu_);
      drained_.notify_all();
    }
  }
}

// ---------------------------------------------------------------- StreamForwarder

StreamForwarder::StreamForwarder(ForwarderConfig cfg) : cfg_(std::move(cfg)) {}

std::string StreamForwarder::stamp(std::chrono::system_clock::time_point now) const {
  if (!cfg_.timestamps) return {};
  auto t = std::chrono::system_clock::to_time_t(now);
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  tm tmv{};
  localtime_r(&t, &tmv);
  char buf[64];
  size_t len = strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tmv);
  return fmt::format("{}.{:06d} ", std::string_view(buf, len), us);
}

void StreamForwarder::remember(const char* p, size_t n) {
  if (cfg_.tail_lines == 0) return;
  // Lines in the tail are capped: the report wants the gist, not a 1 MiB line.
  // Cut where no UTF-8 character is split (the report and its JSON want whole text).
  constexpr size_t kTailLineMax = 1024;
  const size_t room = kTailLineMax - std::min(kTailLineMax, tail_partial_.size());
  tail_partial_.append(p, n <= room ? n : utf8_cut(p, room));
}

void StreamForwarder::end_tail_line() {
  const bool had_text = !tail_partial_.empty();
  strip_escapes(tail_partial_);
  if (had_text && tail_partial_.empty()) {  // escapes alone (a colour reset): nothing shown
    tail_overwrite_ = false;
    return;
  }
  tail_.push_back(std::move(tail_partial_));
  tail_partial_.clear();
  tail_overwrite_ = false;
  if (tail_.size() > cfg_.tail_lines) tail_.pop_front();
}

void StreamForwarder::duplicate(const char* p, size_t n, bool terminated, const std::string& stamp) {
  if (cfg_.filtered_fd < 0 || filtered_lost_) return;
  // A line is matched on its first MiB (raw output sends an overlong line unfinished).
  constexpr size_t kFilteredLineMax = 1 << 20;
  filtered_line_.append(p, std::min(n, kFilteredLineMax - std::min(kFilteredLineMax, filtered_line_.size())));
  if (!terminated) return;
  const bool hit = std::ranges::any_of(
      *cfg_.filters, [&](const std::string& f) { return filtered_line_.find(f) != std::string::npos; });
  if (hit) {
    std::string line;
    line.reserve(stamp.size() + cfg_.prefix.size() + filtered_line_.size());
    line.append(stamp).append(cfg_.prefix).append(filtered_line_);
    if (filtered_line_.size() >= kFilteredLineMax && !line.ends_with('\n')) line += '\n';  // cut at 1 MiB
    if (int err = write_all(cfg_.filtered_fd, line.data(), line.size())) {
      filtered_lost_ = true;
      spdlog::warn("cannot write the filtered lines ({}): this worker's are missing from it from here on",
                   ddp::errno_text(err));
    }
  }
  filtered_line_.clear();
}

void StreamForwarder::emit_piece(std::string& out, const char* p, size_t n, bool terminated,
                                 const std::string& stamp) {
  duplicate(p, n, terminated, stamp);
  // A piece ended by a lone '\r' (a progress bar's state; "\r\n" ends with '\n').
  const bool overwritable = terminated && n > 0 && p[n - 1] == '\r';
  if (cfg_.tail_lines) tail_piece(p, n, terminated, overwritable);
  if (terminated) ++lines_;
  if (cfg_.console) show_piece(*cfg_.console, out, p, n, terminated, overwritable, stamp);
}

// The tail keeps what a terminal shows: what follows a '\r' on its line replaces it.
void StreamForwarder::tail_piece(const char* p, size_t n, bool terminated, bool overwritable) {
  size_t body = n;
  while (body > 0 && (p[body - 1] == '\n' || p[body - 1] == '\r')) --body;
  if (tail_overwrite_ && body > 0) tail_partial_.clear();
  if (body > 0) tail_overwrite_ = false;
  remember(p, body);
  if (overwritable)
    tail_overwrite_ = true;
  else if (terminated)
    end_tail_line();
}

// A piece for the console (into `out`): prefixed where it starts a line, after another
// worker's unfinished line is ended (or its bar erased, on a terminal), this worker's erased
// bar drawn again before it.
void StreamForwarder::show_piece(Console& console, std::string& out, const char* p, size_t n, bool terminated,
                                 bool overwritable, const std::string& stamp) {
  Console* const c = &console;
  const void* open = c->open_line();
  const bool terminal = c->writer->terminal() && !raw();
  // A bar's '\r' alone where the cursor is at a line's start already (a line of another
  // worker's, or after this one's own '\r'): a prefixed empty piece would show nothing (raw
  // output keeps it). The state it ends stays the last one this worker's bar showed.
  if (overwritable && n == 1 && !raw() && (open != this || at_column0_)) {
    bar_line_ = bar_restart_ = true;
    cr_dropped_ = open != this;
    return;
  }
  cr_dropped_ = false;
  // This worker's line, left open, was ended (or erased) by another's line since.
  const bool cut = line_open_ && open != this;
  if (cut) line_open_ = false;
  const bool erased = !c->erased.empty() && std::erase(c->erased, this) > 0;
  // This worker's bar, erased from the terminal by another's line (not ended by a log line):
  // drawn again when its state goes on, or its line ends. Else a bare line end, its line
  // ended already, would only add an empty line.
  const bool bare_end = (n == 1 && p[0] == '\n') || (n == 2 && p[0] == '\r' && p[1] == '\n');
  const bool redraw = cut && erased && bar_line_ && !bar_shown_.empty() && (!bar_restart_ || bare_end);
  if (cut && !redraw && bare_end && !raw()) {
    forget_bar();
    return;
  }
  // Another worker's unfinished line is closed: on a terminal, a bar's state is erased (the
  // bars of several ranks take turns on one line, as under torchrun, instead of scrolling).
  if (open && open != this) {
    if (terminal && c->dangling_bar) {
      out += "\r\x1b[K";
      c->erased.push_back(open);
    } else {
      out += '\n';
    }
  }
  if (open != this || at_column0_) {
    out += stamp;
    out += cfg_.prefix;
    if (redraw) out += bar_shown_;
    flushed_ = redraw ? bar_shown_.size() : 0;
  }
  out.append(p, n);
  flushed_ = terminated ? 0 : flushed_ + n;
  remember_bar(p, n, terminated, overwritable);
  // A state ended by '\r' stays this worker's line (the cursor at its start): another
  // worker's line ends it (erases it, on a terminal), and this one's next piece is prefixed.
  const bool keep_open = !terminated || (overwritable && !raw());
  at_column0_ = terminated && keep_open;
  line_open_ = keep_open;
  c->dangling = keep_open ? this : nullptr;
  c->dangling_bar = keep_open && bar_line_;
  if (keep_open) c->dangling_epoch = c->writer->interruptions();
}

// What of this worker's bar the console shows: its last state (what followed the last '\r'),
// to draw it again once another worker's line erased it.
void StreamForwarder::remember_bar(const char* p, size_t n, bool terminated, bool overwritable) {
  if (terminated && !overwritable) {  // (a line's end: the common case costs a test)
    if (bar_line_ || !bar_shown_.empty()) forget_bar();
    return;
  }
  // (Any unfinished line: a '\r' may make it a bar's state yet.)
  const size_t body = overwritable ? n - 1 : n;
  if (bar_restart_ && body > 0) {
    bar_shown_.clear();
    bar_restart_ = false;
  }
  bar_shown_.append(p, std::min(body, kMaxLine - std::min(kMaxLine, bar_shown_.size())));
  if (overwritable) bar_line_ = bar_restart_ = true;
}

void StreamForwarder::forget_bar() {
  bar_line_ = bar_restart_ = false;
  bar_shown_.clear();
  if (bar_shown_.capacity() > kKeepCapacity) bar_shown_.shrink_to_fit();  // no MiB kept for good
}

void StreamForwarder::send(std::string& out) {
  if (!out.empty() && cfg_.console) cfg_.console->writer->push(std::move(out));
}

void StreamForwarder::feed(const char* data, size_t n, std::chrono::system_clock::time_point now) {
  last_data_ = std::chrono::steady_clock::now();
  if (cfg_.file_fd >= 0 && !file_lost_) {
    if (int err = write_all(cfg_.file_fd, data, n)) {
      file_lost_ = true;
      spdlog::warn("cannot write {} ({}): the rest of this worker's output is missing from it", cfg_.file_name,
                   ddp::errno_text(err));
    }
  }
  if (!cfg_.console && cfg_.tail_lines == 0 && cfg_.filtered_fd < 0) {
    lines_ += static_cast<uint64_t>(std::count(data, data + n, '\n'));
    return;
  }
  const std::string st = stamp(now);
  std::string out;
  out.reserve(n + (n / 16 + 2) * (cfg_.prefix.size() + st.size()));
  const char* p = data;
  const char* end = data + n;
  if (after_cr_ && p < end && *p == '\n') {
    // "\r\n" split across reads: the '\n' ends the line already sent with its '\r' (none
    // was sent when the '\r' began a line: nothing to end).
    Console* c = cfg_.console;
    if (c && !cr_dropped_ && (raw() || c->open_line() == this)) {
      out += '\n';
      if (c->dangling == this) c->dangling = nullptr;
    } else if (c && !cr_dropped_ && line_open_) {
      emit_piece(out, "\n", 1, true, st);  // ended by another's line: redrawn, or nothing
    }
    at_column0_ = line_open_ = false;
    forget_bar();
    if (tail_overwrite_) end_tail_line();
    ++p;
  }
  after_cr_ = false;
  // memchr (vectorised) for '\n'; '\r' is rare, so its next position is found once and
  // reused until passed.
  const char* next_cr = static_cast<const char*>(memchr(p, '\r', static_cast<size_t>(end - p)));
  while (p < end) {
    if (next_cr && next_cr < p) next_cr = static_cast<const char*>(memchr(p, '\r', static_cast<size_t>(end - p)));
    const char* q = static_cast<const char*>(memchr(p, '\n', static_cast<size_t>(end - p)));
    if (!q) q = end;
    if (next_cr && next_cr < q) q = next_cr;
    if (q == end) {
      partial_.append(p, static_cast<size_t>(end - p));
      split_overlong(out, st);
      break;
    }
    size_t term = (*q == '\r' && q + 1 < end && q[1] == '\n') ? 2 : 1;
    if (*q == '\r' && q + 1 == end) after_cr_ = true;
    const char* line_end = q + term;
    if (partial_.empty() && static_cast<size_t>(line_end - p) + open_bytes() <= kMaxLine) {
      emit_piece(out, p, static_cast<size_t>(line_end - p), true, st);
    } else {
      // Split by what the line holds, not counting its end: one of exactly kMaxLine goes whole
      // (its '\n' was cut off before, as an empty line of its own).
      partial_.append(p, static_cast<size_t>(q - p));
      split_overlong(out, st);
      partial_.append(q, term);
      emit_piece(out, partial_.data(), partial_.size(), true, st);
      partial_.clear();
      if (partial_.capacity() > kKeepCapacity) partial_.shrink_to_fit();  // one long line holds no MiB for good
    }
    p = line_end;
  }
  send(out);
}

// Bytes of the current line that idle flushes already put on the console line still open.
size_t StreamForwarder::open_bytes() const {
  return cfg_.console && cfg_.console->open_line() == this ? flushed_ : 0;
}

// Sends kMaxLine pieces of an overlong line, each ending with the continuation mark; the
// first counts what idle flushes already sent of it. Only cuts beyond kMaxLine: the byte
// at the cut must have arrived to tell whether the cut falls inside a UTF-8 character.
// Raw output (an empty prefix, no time stamps) is forwarded byte for byte instead: each
// kMaxLine piece goes out as an idle flush's does, unfinished, and only another worker's
// line in between ends it with a newline (a 200 kB JSON line reaches `| jq` whole).
void StreamForwarder::split_overlong(std::string& out, const std::string& stamp) {
  if (raw()) {
    while (partial_.size() > kMaxLine) {
      const size_t cut = utf8_cut(partial_.data(), kMaxLine);
      emit_piece(out, partial_.data(), cut, false, stamp);
      partial_.erase(0, cut);
    }
    return;
  }
  while (partial_.size() + open_bytes() > kMaxLine) {
    size_t cut = utf8_cut(partial_.data(), kMaxLine - open_bytes());
    std::string piece = partial_.substr(0, cut) + kContinuation;
    emit_piece(out, piece.data(), piece.size(), true, stamp);
    partial_.erase(0, cut);
  }
}

void StreamForwarder::flush_partial(std::chrono::system_clock::time_point now) {
  size_t keep = incomplete_utf8_tail(partial_.data(), partial_.size());
  if (partial_.size() == keep) return;
  std::string out;
  emit_piece(out, partial_.data(), partial_.size() - keep, false, stamp(now));
  partial_.erase(0, partial_.size() - keep);
  if (partial_.capacity() > kKeepCapacity) partial_.shrink_to_fit();
  send(out);
}

// Raw output keeps the worker's bytes: its unfinished last line stays unfinished (another
// worker's line or ddprun's own still starts on a line of its own).
void StreamForwarder::finish(std::chrono::system_clock::time_point now) {
  if (partial_.empty()) {
    // A line flushed while idle and never finished is ended, so the console stays tidy; a
    // bar that another worker's line erased from the terminal shows its last state again.
    Console* c = cfg_.console;
    if (!raw() && c && c->open_line() == this) {
      std::string nl = "\n";
      c->dangling = nullptr;
      send(nl);
    } else if (!raw() && c && line_open_ && bar_line_ && !bar_shown_.empty() &&
               std::find(c->erased.begin(), c->erased.end(), this) != c->erased.end()) {
      std::string out;
      emit_piece(out, "\n", 1, true, stamp(now));
      send(out);
    }
  } else {
    if (!raw()) partial_ += '\n';
    std::string out;
    emit_piece(out, partial_.data(), partial_.size(), !raw(), stamp(now));
    partial_.clear();
    send(out);
  }
  if (cfg_.console) std::erase(cfg_.console->erased, this);  // (its address may be a later one's)
  // A last line that never ended (flushed while idle, or raw) or a bar's last state.
  if (!filtered_line_.empty()) duplicate("\n", 1, true, stamp(now));
  if (cfg_.tail_lines && !tail_partial_.empty()) end_tail_line();
}

// Python's string.Template.safe_substitute: `$name` and `${name}` become value(name) where
// it has one, `$$` becomes `$`; anything else, an unknown name included, stays as written.
std::string safe_substitute(const std::string& tmpl,
                            const std::function<std::optional<std::string>(std::string_view)>& value) {
  auto id_char = [](char c, bool first) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
  };
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    if (tmpl[i] != '$' || i + 1 == tmpl.size()) {
      out += tmpl[i++];
      continue;
    }
    if (tmpl[i + 1] == '$') {
      out += '$';
      i += 2;
      continue;
    }
    const bool braced = tmpl[i + 1] == '{';
    size_t begin = i + (braced ? 2 : 1), end = begin;
    while (end < tmpl.size() && id_char(tmpl[end], end == begin)) ++end;
    const bool closed = !braced || (end < tmpl.size() && tmpl[end] == '}');
    const auto v = end > begin && closed ? value(std::string_view(tmpl).substr(begin, end - begin)) : std::nullopt;
    if (!v) {
      out += tmpl[i++];
      continue;
    }
    out += *v;
    i = end + (braced ? 1 : 0);
  }
  return out;
}

// As torchrun 2.x expands the template: role_name, rank, local_rank (and ddprun's hostname).
std::string expand_prefix(const std::string& tmpl, int rank, int local_rank, const std::string& role,
                          const std::string& hostname) {
  return safe_substitute(tmpl, [&](std::string_view name) -> std::optional<std::string> {
    if (name == "rank") return std::to_string(rank);
    if (name == "local_rank") return std::to_string(local_rank);
    if (name == "role_name") return role;
    if (name == "hostname") return hostname;
    return std::nullopt;
  });
}

}  // namespace ddprun
