"""``python -m nsqpy.spark.jobs``: the ``nsq_spark`` command."""

import sys

from nsqpy.spark.jobs import main

sys.exit(main())
