"""Example toolrl plugin: importing this package registers ``custom/UnitConvert-v0``."""

import toolrl

toolrl.register_env("custom/UnitConvert-v0", "toolrl_custom_env.env:UnitConvertEnv")
