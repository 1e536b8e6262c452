// `flashstep exercise`: the course's exercises in one list, whichever machine they need.
// The CPU exercises (exercises/cpu/NN_name/, one per concept chapter or more) run on a
// laptop; the stage exercises (stages/NN_name/exercise.*) need a CUDA build and a GPU,
// except stage 09's, which is host code. `check` builds nothing: it runs the program the
// build made from your file and says how to rebuild it; `hint` prints the exercise's hint.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <flashstep/reference/errors.hpp>

#include "commands.hpp"
#include "text_table.hpp"

namespace flashstep::cli {

namespace {

struct Exercise {
  std::string name;     ///< what `check` and `hint` accept besides the number
  std::string topic;    ///< "chapter 1" or "stage 01"
  std::string needs;    ///< "CPU", "GPU" or "Hopper GPU"
  std::string file;     ///< the file to edit, from the source root
  std::string program;  ///< the CMake target, and the program in <build>/bin
  std::string hint;     ///< the hint, from the source root
};

Exercise cpu_exercise(const std::string& folder, int chapter) {
  const std::string dir = "exercises/cpu/" + folder;
  return {folder.substr(3),     "chapter " + std::to_string(chapter), "CPU",
          dir + "/attempt.cpp", "flashstep_exercise_cpu_" + folder,   dir + "/hint.md"};
}

// The exercise of a lesson that is not a concept chapter: a feature's folder under stages/.
Exercise lesson_exercise(const std::string& folder, const std::string& lesson) {
  Exercise e = cpu_exercise(folder, 0);
  e.topic = "lesson " + lesson;
  return e;
}

// A CPU exercise of a stage's lesson: a layout or rule its kernel relies on, on a laptop.
Exercise stage_cpu_exercise(const std::string& folder, const std::string& stage) {
  Exercise e = cpu_exercise(folder, 0);
  e.topic = "stage " + stage;
  return e;
}

Exercise stage_exercise(const std::string& folder, const std::string& needs, const std::string& file) {
  return {folder.substr(3),
          "stage " + folder.substr(0, 2),
          needs,
          "stages/" + folder + "/" + file,
          "flashstep_exercise_" + folder,
          "exercises/stages/" + folder + "/hint.md"};
}

// In the order of the course: the concept chapters' exercises, then the stages'.
const std::vector<Exercise>& catalogue() {
  static const std::vector<Exercise> all = {
      cpu_exercise("01_causal_attention", 1),
      cpu_exercise("02_rope", 1),
      cpu_exercise("03_temperature_softmax", 2),
      cpu_exercise("04_greedy_next_token", 2),
      cpu_exercise("05_decode_with_kv_cache", 3),
      cpu_exercise("06_batch_indices_positions", 4),
      cpu_exercise("07_ragged_batch_attention", 4),
      cpu_exercise("08_page_table_append", 5),
      cpu_exercise("09_gather_paged_kv", 5),
      cpu_exercise("10_radix_insert", 6),
      cpu_exercise("11_radix_evict", 6),
      cpu_exercise("12_block_sparse_view", 7),
      cpu_exercise("13_merge_state", 8),
      cpu_exercise("14_cascade_levels", 8),
      cpu_exercise("15_split_kv_plan", 9),
      cpu_exercise("16_top_p_target", 10),
      cpu_exercise("17_rejection_round", 10),
      lesson_exercise("18_attention_sinks", "sinks"),
      lesson_exercise("19_soft_cap", "soft_cap"),
      lesson_exercise("20_fp8_encode", "fp8"),
      lesson_exercise("21_mla_absorb", "mla"),
      stage_cpu_exercise("22_mma_fragments", "03"),
      stage_exercise("01_naive", "GPU", "exercise.cu"),
      stage_exercise("02_paged", "GPU", "exercise.cu"),
      stage_exercise("03_split_kv", "GPU", "exercise.cu"),
      stage_exercise("04_tensor_core", "GPU", "exercise.cu"),
      stage_exercise("05_cascade", "GPU", "exercise.cu"),
      stage_exercise("06_sampling", "GPU", "exercise.cu"),
      stage_exercise("07_hopper", "Hopper GPU", "exercise.cu"),
      stage_exercise("08_context_parallel", "GPU", "exercise.cu"),
      stage_exercise("09_engine", "CPU", "exercise.cpp"),
  };
  return all;
}

std::string own_dir() {
  std::vector<char> buf(4096);
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return ".";
  const std::string path(buf.data(), static_cast<size_t>(n));
  return path.substr(0, path.find_last_of('/'));
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

// The build folder as the user would type it: relative to the working directory when it
// lies inside it ("build"), else as it is.
std::string build_dir() {
  const std::string bin = own_dir();
  const std::string build = bin.substr(0, bin.find_last_of('/'));
  std::vector<char> cwd(4096);
  if (getcwd(cwd.data(), cwd.size()) != nullptr) {
    const std::string here = std::string(cwd.data()) + "/";
    if (build.rfind(here, 0) == 0 && build.size() > here.size()) return build.substr(here.size());
  }
  return build;
}

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A stage exercise exists only in builds with the CUDA stages (stage 09's in every build).
bool configured(const Exercise& e) {
#ifdef FLASHSTEP_CLI_HAVE_STAGES
  (void)e;
  return true;
#else
  return e.needs == "CPU";
#endif
}

const Exercise& find(const std::string& which, int& number) {
  const auto& all = catalogue();
  bool digits = !which.empty() && which.size() < 4;
  for (char c : which) digits = digits && c >= '0' && c <= '9';
  if (digits) {
    number = std::stoi(which);
    if (number >= 1 && number <= static_cast<int>(all.size())) return all[static_cast<size_t>(number - 1)];
  }
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i].name == which || all[i].program == which) {
      number = static_cast<int>(i) + 1;
      return all[i];
    }
  throw ref::InvalidArgument("exercise: no exercise \"" + which + "\" (a number from 1 to " +
                             std::to_string(all.size()) + " or a name; `flashstep exercise list` shows them)");
}

int list(std::ostream& os) {
  const std::string bin = own_dir();
  os << "The course's exercises. Fill in the TODO of the file, rebuild its program, check it.\n\n";
  TextTable table({"#", "name", "topic", "needs", "built", "file to edit"});
  const auto& all = catalogue();
  for (size_t i = 0; i < all.size(); ++i) {
    const Exercise& e = all[i];
    const std::string built = exists(bin + "/" + e.program) ? "yes" : configured(e) ? "no" : "no CUDA build";
    table.add({std::to_string(i + 1), e.name, e.topic, e.needs, built, e.file});
  }
  table.print(os, "  ");
  os << "\nflashstep exercise check N   runs exercise N's program, built by\n"
        "                             cmake --build "
     << build_dir()
     << " --target flashstep_exercise_cpu_NN_name (a stage's: flashstep_exercise_NN_name)\n"
        "flashstep exercise hint N    shows its hint; a CPU exercise's solution is solution.cpp beside it\n"
        "The CPU exercises need no GPU. Their inputs are random, the seed printed: check N --seed S repeats a run.\n";
  return 0;
}

int check(const ExerciseOptions& opt, std::ostream& os) {
  int number = 0;
  const Exercise& e = find(opt.which, number);
  const std::string program = own_dir() + "/" + e.program;
  const std::string rebuild = "cmake --build " + build_dir() + " --target " + e.program;
  os << "exercise " << number << ", " << e.name << " (" << e.topic << ", " << e.needs << "): edit " << e.file << "\n";
  if (!exists(program)) {
    if (!configured(e)) {
      std::string cpu;
      for (size_t i = 0; i < catalogue().size(); ++i)
        if (catalogue()[i].needs == "CPU") cpu += (cpu.empty() ? "" : ", ") + std::to_string(i + 1);
      os << "not here: this build has no CUDA stages (nvcc was not found when CMake configured it), and the "
            "exercise runs on a GPU. These run anywhere: "
         << cpu << ".\n";
      return kExitSkipped;
    }
    os << "not built yet: " << rebuild << "\n";
    return kExitSkipped;
  }
  std::string cmd = quoted(program);
  if (opt.seed) {
    if (e.file.rfind("exercises/cpu/", 0) == 0) cmd += " --seed " + std::to_string(*opt.seed);
    else os << "(a stage exercise picks its own cases; --seed is ignored)\n";
  }
  os << "$ " << e.program
     << (opt.seed && e.file.rfind("exercises/cpu/", 0) == 0 ? " --seed " + std::to_string(*opt.seed) : "") << "\n"
     << std::flush;
  FILE* out = popen((cmd + " 2>&1").c_str(), "r");
  if (out == nullptr) {
    os << "could not run " << program << "\n";
    return 1;
  }
  char buf[4096];
  while (fgets(buf, sizeof buf, out) != nullptr) os << buf << std::flush;
  const int status = pclose(out);
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  os << "\n";
  if (rc == 0) os << "exercise " << number << " passes.\n";
  else if (rc == kExitSkipped) os << "exercise " << number << " could not run here (the reason is above).\n";
  else os << "exercise " << number << " does not pass yet. A hint: flashstep exercise hint " << number << "\n";
  os << "after editing " << e.file << ": " << rebuild << " && flashstep exercise check " << number << "\n";
  return rc;
}

int hint(const ExerciseOptions& opt, std::ostream& os) {
  int number = 0;
  const Exercise& e = find(opt.which, number);
  const std::string path = std::string(FLASHSTEP_SOURCE_DIR) + "/" + e.hint;
  std::ifstream in(path);
  if (!in) {
    os << "no hint file at " << path << " (hints are read from the source tree)\n";
    return 1;
  }
  std::ostringstream text;
  text << in.rdbuf();
  os << "exercise " << number << ", " << e.name << " (" << e.topic << "): edit " << e.file << "\n\n" << text.str();
  return 0;
}

}  // namespace

int run_exercise_command(const ExerciseOptions& opt, std::ostream& os) {
  if (opt.action == "list") return list(os);
  if (opt.action == "check") return check(opt, os);
  return hint(opt, os);
}

}  // namespace flashstep::cli
