# Copies the parts of MathJax 2 the site uses (TeX input, CommonHTML output, its web
# fonts, English) from Debian's libjs-mathjax into the site, so the site needs no CDN.
# Usage: cmake -DSOURCE=/usr/share/javascript/mathjax -DDEST=<html>/mathjax -P copy_mathjax.cmake
if(NOT SOURCE OR NOT DEST)
  message(FATAL_ERROR "copy_mathjax.cmake: pass -DSOURCE=<mathjax dir> -DDEST=<site>/mathjax")
endif()
file(COPY ${SOURCE}/MathJax.js ${SOURCE}/config ${SOURCE}/extensions DESTINATION ${DEST})
file(COPY ${SOURCE}/jax/input/TeX DESTINATION ${DEST}/jax/input)
file(COPY ${SOURCE}/jax/output/CommonHTML DESTINATION ${DEST}/jax/output)
file(COPY ${SOURCE}/jax/element DESTINATION ${DEST}/jax)
file(COPY ${SOURCE}/fonts/HTML-CSS/TeX/woff DESTINATION ${DEST}/fonts/HTML-CSS/TeX)
if(EXISTS ${SOURCE}/localization/en)
  file(COPY ${SOURCE}/localization/en DESTINATION ${DEST}/localization)
endif()
