// MathJax 2 settings added after Doxygen's own (MATHJAX_CODEFILE).
// - Output through CommonHTML: the fastest MathJax 2 output, and the one whose files
//   docs/copy_mathjax.cmake copies into the site (Doxygen 1.9.4 only offers HTML-CSS).
// - Inline math as $...$ (Jupyter's habit, used by the notebook pages) as well as
//   \(...\) (Doxygen's \f$ output). tex2jax never looks inside code blocks.
MathJax.Hub.Config({
  jax: ["input/TeX", "output/CommonHTML"],
  tex2jax: {inlineMath: [['$', '$'], ['\\(', '\\)']], processEscapes: true}
});
