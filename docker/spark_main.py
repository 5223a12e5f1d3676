"""spark-submit's primary resource for SparkApplication pods: runs `cbgp spark-job <args>`.

spark-submit only treats a primary resource as Python if its name ends in `.py`, so the `cbgp`
console script itself cannot be the SparkApplication's mainApplicationFile.
"""

import sys

from services.commands.main import main  # the installed `cbgp` entry point (engine + fleet commands)

if __name__ == "__main__":
    sys.argv = ["cbgp", "spark-job", *sys.argv[1:]]
    sys.exit(main())
