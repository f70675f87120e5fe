// online_dispatch's reference runner: one native thread that re-runs aten ops on their float64
// host copies and measures each output against the device's, without the GIL (see
// torch_reference_runner.py for why and when it is used).
//
// The user's thread submits an op (its overload, the reference's arguments, the device's output
// leaves) and goes on; the runner calls the op through the dispatcher exactly as the Python
// OpOverload call would, then takes the one-pass figures of every plain float leaf with the host
// kernels' function (passed in by address, so both paths run the same machine code). The user's
// thread collects the results in submission order. No Python object is touched off the user's
// thread: tensors cross as at::Tensor, and Python keeps its own references alive until a task is
// collected, so no Python object is ever released here.
#include <torch/extension.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>

#include <array>
#include <condition_variable>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

using PartsFn = int (*)(const void*, const void*, ptrdiff_t, double*);

struct Task {
  std::optional<c10::OperatorHandle> op;  // none for a Python reference (call)
  torch::jit::Stack stack;
  std::vector<at::Tensor> dev;  // undefined where a device leaf is not one the kernel reads
  bool inference;
  bool cast;              // the stack holds the device's arguments: copy them to float64 here
  int64_t half_to_float;  // with cast: the position of a half_to_float argument to set false, or -1
  bool failed = false;
  bool done = false;
  std::vector<c10::IValue> inputs;  // with cast: the reference's arguments, for the rows
  // the arguments as submitted. The user's tensors (and the probe's copies) have Python objects,
  // and PyTorch takes the GIL when the last C++ reference beside a Python object ends
  // (intrusive_ptr's 2 -> 1 decref_pyobject): these and `dev` are let go by Channel::next on the
  // user's thread, which holds the GIL, so the runner never waits for it (a step's ~800 hand-overs)
  torch::jit::Stack submitted;
  std::vector<std::array<double, 5>> parts;
  std::vector<char> measured;
  // a Python reference: its callable and arguments, and its result; set and released with the GIL held
  py::object call, args, kwargs, result;
  Task(c10::OperatorHandle o, torch::jit::Stack s, std::vector<at::Tensor> d, bool inf, bool c, int64_t h)
      : op(std::move(o)), stack(std::move(s)), dev(std::move(d)), inference(inf), cast(c), half_to_float(h) {}
  Task(py::object f, py::object a, py::object k, bool inf)
      : inference(inf), cast(false), half_to_float(-1), call(std::move(f)), args(std::move(a)), kwargs(std::move(k)) {}
};

// the reference dtype of a host device's dtype (reference.reference_dtype with the CPU under test)
c10::ScalarType reference_dtype(c10::ScalarType dtype) {
  if (c10::isComplexType(dtype)) {
    return c10::kComplexDouble;
  }
  return c10::isFloatingType(dtype) ? c10::kDouble : dtype;
}

// a private copy of a device argument in its reference dtype, never a view (reference._copy):
// a cast where the dtype changes, else a clone; a wrapped Python number stays as it is, as the
// Python path passes the number itself
at::Tensor reference_copy(const at::Tensor& t) {
  if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) {
    return t;
  }
  c10::ScalarType target = reference_dtype(t.scalar_type());
  return target == t.scalar_type() ? t.clone() : t.to(target);
}

bool is_dtype_argument(const c10::Argument& arg) {
  c10::TypePtr type = arg.real_type();
  if (auto optional = type->cast<c10::OptionalType>()) {
    type = optional->getElementType();
  }
  return type->kind() == c10::TypeKind::ScalarTypeType;
}

// reference._convert on a stack: tensors copied, dtypes mapped, devices the CPU
void convert(const c10::FunctionSchema& schema, torch::jit::Stack& stack, int64_t half_to_float) {
  const auto& arguments = schema.arguments();
  for (size_t i = 0; i < stack.size() && i < arguments.size(); ++i) {
    c10::IValue& v = stack[i];
    if (v.isTensor()) {
      v = reference_copy(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> copies;
      for (const at::Tensor& t : v.toTensorList()) {
        copies.push_back(reference_copy(t));
      }
      v = copies;
    } else if (v.isList()) {
      c10::impl::GenericList items = v.toList();
      c10::impl::GenericList copies(items.elementType());
      for (const c10::IValue& item : items) {
        copies.push_back(item.isTensor() ? c10::IValue(reference_copy(item.toTensor())) : item);
      }
      v = copies;
    } else if (v.isInt() && is_dtype_argument(arguments[i])) {
      v = static_cast<int64_t>(reference_dtype(static_cast<c10::ScalarType>(v.toInt())));
    } else if (v.isDevice()) {
      v = c10::Device(c10::kCPU);
    }
  }
  if (half_to_float >= 0 && static_cast<size_t>(half_to_float) < stack.size()) {
    stack[half_to_float] = false;
  }
}

// a device leaf and a reference leaf the one-pass kernel reads: plain dense host memory, one
// shape, the reference in float64 (the Python path's torch_kernels.dispatch_parts conditions)
bool readable(const at::Tensor& t) {
  if (!t.defined() || !t.is_cpu() || t.layout() != c10::kStrided || t.is_conj() || t.is_neg() ||
      !t.is_contiguous()) {
    return false;
  }
  constexpr c10::DispatchKeySet foreign(
      {c10::DispatchKey::Python, c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper,
       c10::DispatchKey::Functionalize, c10::DispatchKey::PythonTLSSnapshot});
  return !t.key_set().has_any(foreign) && t.has_storage();
}

// the overloads the runners were given, by index: one table for the process (the caller keeps
// each overload's index for its lifetime, across runners); used on the user's thread only
std::vector<c10::OperatorHandle>& operators() {
  static std::vector<c10::OperatorHandle> table;
  return table;
}

// an overload's index in operators(), -1 when the dispatcher does not know it
int64_t operator_index(const std::string& name, const std::string& overload) {
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle) {
    return -1;
  }
  operators().push_back(*handle);
  return static_cast<int64_t>(operators().size()) - 1;
}

class Runner {
 public:
  Runner(uintptr_t f32, uintptr_t f64, uintptr_t bf16, int64_t max_elements)
      : f32_(reinterpret_cast<PartsFn>(f32)), f64_(reinterpret_cast<PartsFn>(f64)),
        bf16_(reinterpret_cast<PartsFn>(bf16)), max_elements_(max_elements) {
    thread_ = std::thread([this] { loop(); });
  }

  ~Runner() { stop(); }

  // (Channel's) queue a task for the thread
  void queue(std::shared_ptr<Task> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      todo_.push_back(std::move(task));
    }
    work_.notify_one();
  }

  bool is_done(const Task& task) {
    std::lock_guard<std::mutex> lock(mutex_);
    return task.done;
  }

  // waits for a task without the GIL
  void wait(const Task& task) {
    py::gil_scoped_release no_gil;
    std::unique_lock<std::mutex> lock(mutex_);
    finished_.wait(lock, [&] { return task.done; });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) {
        return;
      }
      stopping_ = true;
    }
    work_.notify_one();
    if (thread_.joinable()) {
      if (PyGILState_Check()) {
        py::gil_scoped_release no_gil;
        thread_.join();
      } else {
        thread_.join();
      }
    }
  }

 public:
  static bool plain_argument(const c10::IValue& v) {
    if (v.isTensor()) {
      const auto& t = v.toTensor();
      return !t.defined() || readable_argument(t);
    }
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        if (!readable_argument(t)) {
          return false;
        }
      }
      return true;
    }
    if (v.isList()) {  // Tensor?[] (index) and the like
      for (const auto& item : v.toListRef()) {
        if (!plain_argument(item)) {
          return false;
        }
      }
    }
    return true;
  }

  static void run_python(Task& task) {
    py::gil_scoped_acquire gil;
    try {
      task.result = task.call(*task.args, **task.kwargs);
    } catch (py::error_already_set&) {
      task.failed = true;
    } catch (...) {
      task.failed = true;
    }
    if (task.failed) {
      task.result = py::object();
    }
    task.call = task.args = task.kwargs = py::object();  // released here, with the GIL
  }

  static bool holds_tensor(c10::ArrayRef<c10::IValue> items) {
    for (const auto& item : items) {
      if (item.isTensor()) {
        return true;
      }
    }
    return false;
  }

  static bool readable_argument(const at::Tensor& t) {
    constexpr c10::DispatchKeySet foreign(
        {c10::DispatchKey::Python, c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper,
         c10::DispatchKey::Functionalize, c10::DispatchKey::PythonTLSSnapshot});
    return t.is_cpu() && !t.key_set().has_any(foreign);
  }

 private:
  void loop() {
    for (;;) {
      std::shared_ptr<Task> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_.wait(lock, [&] { return stopping_ || !todo_.empty(); });
        if (todo_.empty()) {
          return;
        }
        task = todo_.front();
        todo_.pop_front();
      }
      try {
        run(*task);
      } catch (...) {  // never expected: the op is then judged on the user's thread
        task->failed = true;
        task->stack.clear();
        task->inputs.clear();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        task->done = true;
      }
      finished_.notify_all();
    }
  }

  void run(Task& task) {
    try {
      c10::AutoGradMode no_grad(false);
      std::optional<c10::InferenceMode> inference;
      if (task.inference) {
        inference.emplace();
      }
      if (!task.op) {
        run_python(task);
        return;
      }
      task.submitted = task.stack;  // (3 references where there were 2: no GIL either way)
      if (task.cast) {
        convert(task.op->schema(), task.stack, task.half_to_float);
        task.inputs = task.stack;
      }
      task.op->callBoxed(&task.stack);
    } catch (...) {
      task.failed = true;
      task.stack.clear();
      task.inputs.clear();
      return;
    }
    std::vector<at::Tensor> refs;
    bool flat = true;
    for (const auto& v : task.stack) {
      if (v.isTensor()) {
        refs.push_back(v.toTensor());
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) {
          refs.push_back(t);
        }
      } else if (v.isNone() || v.isInt() || v.isDouble() || v.isBool()) {
        refs.emplace_back();
      } else {
        flat = false;
      }
    }
    size_t n = task.dev.size();
    task.parts.resize(n);
    task.measured.assign(n, 0);
    if (flat && refs.size() == n) {
      for (size_t i = 0; i < n; ++i) {
        try {
          measure(task.dev[i], refs[i], task.parts[i], task.measured[i]);
        } catch (...) {  // a leaf the kernel cannot read after all: measured on the user's thread
          task.measured[i] = 0;
        }
      }
    }
  }

  void measure(const at::Tensor& leaf, const at::Tensor& ref_leaf, std::array<double, 5>& out, char& measured) const {
    if (!leaf.defined() || !ref_leaf.defined() || ref_leaf.scalar_type() != at::kDouble ||
        leaf.layout() != c10::kStrided || ref_leaf.layout() != c10::kStrided || leaf.sizes() != ref_leaf.sizes()) {
      return;
    }
    // flat, as figure_parts.leaf_figures reads a pair: a leaf of other than one dimension is
    // reshaped (a copy in index order where its memory has gaps or another order)
    at::Tensor dev = leaf.dim() != 1 ? leaf.reshape({-1}) : leaf;
    at::Tensor ref = ref_leaf.dim() != 1 ? ref_leaf.reshape({-1}) : ref_leaf;
    if (!readable(dev) || !readable(ref)) {
      return;
    }
    int64_t numel = dev.numel();
    if (numel <= 0 || numel > max_elements_) {
      return;
    }
    PartsFn fn = nullptr;
    switch (dev.scalar_type()) {
      case at::kFloat: fn = f32_; break;
      case at::kDouble: fn = f64_; break;
      case at::kBFloat16: fn = bf16_; break;
      default: return;
    }
    if (fn == nullptr) {
      return;
    }
    int flags = fn(dev.const_data_ptr(), ref.const_data_ptr(), static_cast<ptrdiff_t>(numel), out.data());
    if (flags) {
      out[3] = out[4] = std::numeric_limits<double>::quiet_NaN();
    }
    out[3] += 0.0;  // a zero extremum is +0.0 (torch_kernels.dispatch_parts)
    out[4] += 0.0;
    measured = 1;
  }

  PartsFn f32_, f64_, bf16_;
  int64_t max_elements_;
  std::deque<std::shared_ptr<Task>> todo_;     // not started (under mutex_)
  std::mutex mutex_;
  std::condition_variable work_, finished_;
  bool stopping_ = false;
  std::thread thread_;
};

// one user's queue on the shared runner: its tasks in submission order, collected by `next` on
// the thread that submitted them (each dispatch mode has its own; the runner's thread is shared
// by the process, so its start-up is paid once)
class Channel {
 public:
  explicit Channel(std::shared_ptr<Runner> runner) : runner_(std::move(runner)) {}

  // false when the arguments do not make a stack for the schema, or hold a tensor the runner
  // does not take (a subclass, a transform's wrapper): the caller then runs the op itself
  bool submit(int64_t op, const py::tuple& args, const py::dict& kwargs, const py::list& dev, bool inference,
              bool cast, int64_t half_to_float) {
    const auto& handle = operators().at(op);
    torch::jit::Stack stack;
    try {
      // a Python number given for a Tensor argument becomes a wrapped number, as in the
      // OpOverload call (its type promotion is a scalar's)
      torch::jit::ToIValueAllowNumbersAsTensors numbers(true);
      stack = torch::jit::createStackForSchema(handle.schema(), torch::jit::tuple_slice(args),
                                               py::reinterpret_borrow<py::kwargs>(kwargs), std::nullopt);
    } catch (...) {
      return false;
    }
    for (const auto& v : stack) {
      if (!Runner::plain_argument(v)) {
        return false;
      }
    }
    std::vector<at::Tensor> leaves;
    leaves.reserve(dev.size());
    for (const auto& item : dev) {
      leaves.push_back(item.is_none() ? at::Tensor() : py::cast<at::Tensor>(item));
    }
    queue(std::make_shared<Task>(handle, std::move(stack), std::move(leaves), inference, cast, half_to_float));
    return true;
  }

  // a reference written in Python (attention's): called on the runner's thread with the GIL, in
  // its turn; its result comes back as the reference output, without parts
  void submit_python(py::object call, py::tuple args, py::dict kwargs, bool inference) {
    queue(std::make_shared<Task>(std::move(call), std::move(args), std::move(kwargs), inference));
  }

  size_t pending() const { return pending_.size(); }

  // whether the oldest pending task is done (false when none is pending)
  bool ready() {
    if (pending_.empty()) {
      return false;
    }
    return runner_->is_done(*pending_.front());
  }

  // the oldest pending task's result, waiting for it: (failed, reference output, parts, inputs),
  // where parts[i] is the i-th device leaf's [r.r, r.d, d.d, max d, min d] or None, and inputs
  // (with cast) the reference's argument at each position of the schema when it holds tensors,
  // else None
  py::object next() {
    if (pending_.empty()) {
      throw std::runtime_error("no pending reference");
    }
    std::shared_ptr<Task> task = pending_.front();
    pending_.pop_front();
    runner_->wait(*task);
    // the tensors with Python objects let go here, with the GIL, whichever thread drops the task
    // last (a task whose channel closed before collecting it is released on the runner's thread,
    // which then takes the GIL, holding no lock)
    task->submitted.clear();
    task->dev.clear();
    if (task->failed) {
      return py::make_tuple(true, py::none(), py::none(), py::none());
    }
    if (!task->op) {
      py::object result = std::move(task->result);
      return py::make_tuple(false, result, py::none(), py::none());
    }
    py::object inputs = py::none();
    if (task->cast) {
      py::list items;
      for (auto& v : task->inputs) {
        // (a wrapped number is the call's Python number: the rows read the number)
        bool tensors = (v.isTensor() && !v.toTensor().unsafeGetTensorImpl()->is_wrapped_number()) ||
                       v.isTensorList() || (v.isList() && Runner::holds_tensor(v.toListRef()));
        items.append(tensors ? torch::jit::toPyObject(std::move(v)) : py::none());
      }
      inputs = items;
    }
    py::list parts;
    for (size_t i = 0; i < task->measured.size(); ++i) {
      if (task->measured[i]) {
        const auto& p = task->parts[i];
        parts.append(py::make_tuple(p[0], p[1], p[2], p[3], p[4]));
      } else {
        parts.append(py::none());
      }
    }
    py::object out = torch::jit::createPyObjectForStack(std::move(task->stack));
    return py::make_tuple(false, out, parts, inputs);
  }

 private:
  void queue(std::shared_ptr<Task> task) {
    pending_.push_back(task);
    runner_->queue(std::move(task));
  }

  std::shared_ptr<Runner> runner_;
  std::deque<std::shared_ptr<Task>> pending_;  // submitted, not collected (the user's thread only)
};

// Whether a code object's file lies under one of the `skipped` folders, remembered per code
// object (a strong reference is kept, so the address is never another's; at most 4096, then all
// dropped): a transformer's forward walks ~40 frames at every op judged later, mostly the same code
// objects. Touched with the GIL only.
struct SkipCache {
  PyObject* prefixes = nullptr;
  std::unordered_map<PyObject*, bool> known;

  void clear() {
    for (auto& entry : known) {
      Py_DECREF(entry.first);
    }
    known.clear();
  }
};

SkipCache& skip_cache() {
  static SkipCache* cache = new SkipCache();  // never destroyed: no Python object is released at exit
  return *cache;
}

bool skipped_code(PyCodeObject* code, const py::tuple& skipped) {
  SkipCache& cache = skip_cache();
  if (cache.prefixes != skipped.ptr()) {
    cache.clear();
    Py_XDECREF(cache.prefixes);
    cache.prefixes = skipped.ptr();
    Py_INCREF(cache.prefixes);
  }
  PyObject* key = reinterpret_cast<PyObject*>(code);
  auto hit = cache.known.find(key);
  if (hit != cache.known.end()) {
    return hit->second;
  }
  bool skip = false;
  for (const auto& prefix : skipped) {
    if (PyUnicode_Tailmatch(code->co_filename, prefix.ptr(), 0, PY_SSIZE_T_MAX, -1) == 1) {
      skip = true;
      break;
    }
  }
  if (cache.known.size() >= 4096) {  // (a model's stacks hold a few hundred; generated code would grow it)
    cache.clear();
  }
  Py_INCREF(key);
  cache.known.emplace(key, skip);
  return skip;
}

// The user's frames of a call, kept as (code object, instruction offset) until a failing row
// reads them: the line number is a walk of the code's line table, paid only then.
class CodeFrames {
 public:
  CodeFrames() = default;
  CodeFrames(const CodeFrames&) = delete;
  CodeFrames& operator=(const CodeFrames&) = delete;
  ~CodeFrames() {
    for (auto& frame : frames_) {
      Py_DECREF(frame.first);
    }
  }

  // where: an instruction offset, or -1 - the line number where the line was read at once
  void add(PyCodeObject* code, int where) {
    Py_INCREF(code);
    frames_.emplace_back(code, where);
  }

  // ((filename, line, function), ...), outermost first (the frames were added innermost first)
  py::tuple resolve() const {
    py::tuple out(frames_.size());
    for (size_t i = 0; i < frames_.size(); ++i) {
      const auto& frame = frames_[frames_.size() - 1 - i];
      PyCodeObject* code = frame.first;
      int line = frame.second >= 0 ? PyCode_Addr2Line(code, frame.second) : -1 - frame.second;
      out[i] = py::make_tuple(py::reinterpret_borrow<py::object>(code->co_filename), line,
                              py::reinterpret_borrow<py::object>(code->co_name));
    }
    return out;
  }

 private:
  std::vector<std::pair<PyCodeObject*, int>> frames_;
};

// call_stack.capture_stack's walk in C (it runs for every op judged later, ~40 frames deep in a
// transformer's forward): the frames from `frame` outwards whose file starts with none of `skipped`
std::unique_ptr<CodeFrames> walk_frames(const py::object& frame, const py::tuple& skipped) {
  auto frames = std::make_unique<CodeFrames>();
  PyFrameObject* f = reinterpret_cast<PyFrameObject*>(frame.ptr());
  Py_XINCREF(f);
  while (f != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(f);  // a new reference
    if (!skipped_code(code, skipped)) {
#if PY_VERSION_HEX >= 0x030B0000
      // the offset, later resolved as PyFrame_GetLineNumber resolves an untraced frame's
      // (capture_stack reads lines at once while a trace function is set)
      int where = PyFrame_GetLasti(f);
      frames->add(code, where >= 0 ? where : -1 - PyFrame_GetLineNumber(f));
#else
      frames->add(code, -1 - PyFrame_GetLineNumber(f));
#endif
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(f);  // a new reference
    Py_DECREF(f);
    f = back;
  }
  return frames;
}

py::tuple user_frames(const py::object& frame, const py::tuple& skipped) {
  return walk_frames(frame, skipped)->resolve();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("operator_index", &operator_index);
  m.def("user_frames", &user_frames);
  m.def("user_code_frames", &walk_frames);
  py::class_<CodeFrames>(m, "CodeFrames").def("resolve", &CodeFrames::resolve);
  py::class_<Runner, std::shared_ptr<Runner>>(m, "Runner")
      .def(py::init<uintptr_t, uintptr_t, uintptr_t, int64_t>())
      .def("stop", &Runner::stop);
  py::class_<Channel>(m, "Channel")
      .def(py::init<std::shared_ptr<Runner>>())
      .def("submit", &Channel::submit)
      .def("submit_python", &Channel::submit_python)
      .def("pending", &Channel::pending)
      .def("ready", &Channel::ready)
      .def("next", &Channel::next);
}
